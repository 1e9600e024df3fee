"""Whether `pdserve check` looks at the host it runs on, and the rule it applied, in words.

Asked (--host) or refused (--no-host), the answer is the user's. Otherwise the host checks run only
where this host looks like the deployment's target: systemd is running (the units need it), and the
NVIDIA GPUs and NUMA nodes the file names exist here. On a laptop or a CI runner they are skipped
with that reason, instead of failing the file for "GPU 7 does not exist".
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.check.host import HostView
from pdserve.schema.config import Deployment
from pdserve.schema.placement import place


@dataclass(frozen=True)
class HostRule:
    on: bool
    rule: str  # what `check` prints after "host checks: "


def _named(dep: Deployment) -> tuple[list[int], list[int]]:
    servers = [p.spec for p in place(dep).placed if p.spec is not None]
    gpus = sorted({g for s in servers for g in s.gpus})
    nodes = sorted({s.numa_node for s in servers if s.numa_node is not None})
    return gpus, nodes


def unlike_target(dep: Deployment, systemd_missing: str | None, view: HostView) -> list[str]:
    """Why this host is not the deployment's target; empty when it looks like it."""
    gpus, nodes = _named(dep)
    reasons = [systemd_missing] if systemd_missing else []
    if view.gpu_bus_ids is None or not view.gpu_bus_ids:
        reasons.append(f"this host has no GPU that can be read (the file names GPUs {_span(gpus)})")
    elif max(gpus) >= len(view.gpu_bus_ids):
        reasons.append(f"this host has {len(view.gpu_bus_ids)} GPU(s), the file names GPUs {_span(gpus)}")
    missing_nodes = [n for n in nodes if view.numa_nodes is None or n not in view.numa_nodes]
    if missing_nodes:
        have = "none readable" if view.numa_nodes is None else str(view.numa_nodes)
        reasons.append(f"NUMA node(s) {missing_nodes} the file names are not on this host (it has {have})")
    return reasons


def _span(values: list[int]) -> str:
    if values and values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))


def decide(dep: Deployment, asked: bool | None, systemd_missing: str | None, view: HostView | None) -> HostRule:
    """The rule for one deployment: `asked` is --host (True), --no-host (False) or neither (None);
    `view` may be None only when `asked` is not None (then the host is not read to decide)."""
    if dep.multi_host and asked is not False:
        # The host checks compare one host's GPUs, NUMA nodes and files with what the file places there;
        # which of a multi-host deployment's hosts this one is, `check` cannot tell yet.
        return HostRule(False, f"off: deployment {dep.name} spans hosts ({', '.join(dep.hosts)}); checking one of "
                               "them against its placement is not supported yet")
    if asked is True:
        return HostRule(True, "on (asked with --host)")
    if asked is False:
        return HostRule(False, "off (--no-host)")
    assert view is not None
    reasons = unlike_target(dep, systemd_missing, view)
    if reasons:
        return HostRule(False, f"off: {'; '.join(reasons)}; use --host to force them")
    gpus, nodes = _named(dep)
    return HostRule(True, f"on (this host looks like the target: systemd is running, GPUs {_span(gpus)} "
                          f"and NUMA nodes {nodes or 'none named'} are here; --no-host turns them off)")
