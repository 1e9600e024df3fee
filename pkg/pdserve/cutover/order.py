"""The order of a multi-host deployment's cutover across its hosts. Pure.

`pdserve cutover` drives only the systemd it runs beside: it never reaches into another host (no ssh),
so on a multi-host deployment each host runs its own step, `pdserve cutover pd --host NAME`, which
starts, waits for and smoke-tests only that host's units (the same plan and state machine as on one
host: pdserve.cutover.plan.plan_for of that host) and refuses units of other hosts. `order` is the sequence across hosts
the operator (or their own orchestration) follows:

  1. every host with servers, at the same time: the nodes of a multi-node server wait for each other
     at --dist-init-addr, so one host's step cannot end before the other's has started;
  2. the router host(s): the router's readiness gate waits for every server over the cluster network,
     then the smoke test goes through it.

Stopping goes the other way: routers first (no request reaches a server that is going), then the servers.
A multi-host deployment has no single-server fallback, so only `pd` exists.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.cutover.plan import plan_for
from pdserve.schema.boot import nixos_line
from pdserve.schema.config import Deployment
from pdserve.schema.topology import router_hosts

NO_FALLBACK = ("a multi-host deployment has no single-server fallback ([fallback] is for one host), so there is "
               "no single layout to cut over to; stop its units host by host instead (`pdserve cutover pd "
               "--dry-run` prints the order)")


@dataclass(frozen=True)
class HostStep:
    """What one host does in a cutover to PD: its units, in start order, and the commands that do it."""

    host: str
    address: str
    workers: tuple[str, ...]  # its server units (every node placed here)
    fronts: tuple[str, ...]  # its router unit, when the router runs here
    cutover: str  # the pdserve command that does this host's step
    start: str  # the same with systemctl alone
    stop: str  # the units in stop order: router first


def host_units(dep: Deployment, host: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(server units, router units) placed on `host`, as `pdserve render --host` names them."""
    plan = plan_for(dep, "pd", host=host)
    return plan.workers["pd"], plan.fronts["pd"]


def _start(units: Sequence[str]) -> str:
    return f"systemctl start {' '.join(units)}" if units else "nothing to start"


def order(dep: Deployment, config: str) -> list[HostStep]:
    """The hosts in the order of a cutover to PD: server-only hosts first, router hosts last (each group in
    file order). `config` is the deployment file as each host names it (the same file on every host)."""
    routers = router_hosts(dep)
    hosts = [h for h in dep.hosts if h not in routers] + [h for h in dep.hosts if h in routers]
    steps = []
    for host in hosts:
        workers, fronts = host_units(dep, host)
        if not workers and not fronts:
            continue
        steps.append(HostStep(
            host=host, address=dep.hosts[host].address, workers=workers, fronts=fronts,
            cutover=f"pdserve cutover pd -c {shlex.quote(config)} --host {host}",
            start=" && ".join(_start(group) for group in (workers, fronts) if group),
            stop=f"systemctl stop {' '.join(fronts + workers)}",
        ))
    return steps


def order_lines(dep: Deployment, config: str) -> list[str]:
    """The order across hosts, for people: the exact command per host, and the systemctl-only equivalent."""
    steps = order(dep, config)
    servers = [s for s in steps if not s.fronts]
    routers = [s for s in steps if s.fronts]
    lines = [f"cutover of {dep.name} to pd across {len(steps)} hosts: pdserve acts on the host it runs on only; "
             "run each host's step there, in this order:"]
    if servers:
        lines.append(f"  1. at the same time on {', '.join(s.host for s in servers)} (the nodes of a multi-node "
                     "server wait for each other; each step ends once its units are active):")
        lines += [f"       on {s.host} ({s.address}): {s.cutover}    # or: {s.start}" for s in servers]
    lines.append(f"  {2 if servers else 1}. then on the router host{'s' if len(routers) > 1 else ''} (its readiness "
                 "gate waits for every server over the cluster network; the smoke test goes through it):")
    lines += [f"       on {s.host} ({s.address}): {s.cutover}    # or: {s.start}" for s in routers]
    lines.append("  to stop: the router host(s) first, then the others: "
                 + "; ".join(f"on {s.host}: {s.stop}" for s in routers + servers))
    lines.append(f"  at boot (NixOS): every host's module wants its units (boot_layout = \"{dep.boot_layout}\", "
                 f"`{nixos_line(dep, 'pd')}`)")
    return lines


class UnknownHost(ValueError):
    pass


def this_host(dep: Deployment, asked: str | None, addresses: Sequence[str]) -> str | None:
    """The host a cutover acts on: --host, else the one whose cluster address this machine has; None when
    neither says (a cutover never guesses: another host's units are not this one's to start)."""
    if asked is not None:
        if asked not in dep.hosts:
            raise UnknownHost(
                f"--host {asked}: not a host of deployment {dep.name}; its hosts are {', '.join(dep.hosts)}")
        return asked
    mine = [name for name, spec in dep.hosts.items() if spec.address in addresses]
    return mine[0] if len(mine) == 1 else None
