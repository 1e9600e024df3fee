"""What "ready" means for each role, and a bounded wait for it.

A worker is ready when /health answers 200 and /model_info (or, in SGLang releases whose /model_info
lacks it, /server_info) reports the disaggregation mode the role expects, so a decode server on the
prefill's port is not mistaken for it. The router is ready when /readiness answers 200 with every
expected worker healthy. Each request is bounded by pdserve.probes.http's client (whole exchange, body
size, no redirect); the wait has a deadline and ends with the last state it saw.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from pdserve.launch.main_process import MainProcess, check_alive
from pdserve.probes import http
from pdserve.probes.answers import Mismatch, shown
from pdserve.probes.metrics import MAX_BYTES as METRICS_MAX_BYTES
from pdserve.probes.router import worker_counts
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import disaggregation_mode
from pdserve.schema.placement import role_url
from pdserve.schema.topology import server_named, servers

# The wait probes once more at its deadline; that probe's requests may run this much past it, so a wait of
# T seconds ends within T + LAST_PROBE_S (and a few milliseconds) whatever a server does.
LAST_PROBE_S = 1.0


@dataclass(frozen=True)
class Observation:
    ready: bool
    state: str


Probe = Callable[[], Observation]


class _Unreachable(Exception):
    """No HTTP answer at all (refused, timed out); its text is probes.http's error."""


class _Unread(Exception):
    """An answer that cannot be read (not JSON, too deep, a redirect): its text names it."""


def _get(client: httpx.Client, url: str, max_bytes: int = http.JSON_MAX_BYTES) -> tuple[int, object]:
    """(status, body: parsed JSON, or the text) through probes.http, which bounds and reads the request."""
    seen = http.get(client, url, max_bytes=max_bytes)
    if seen.status is None:
        raise _Unreachable(seen.error)
    if seen.error:
        raise _Unread(f"GET {url} answered {seen.status}, {seen.error}")
    return seen.status, seen.body


_ENGINE_TYPE = re.compile(r'^sglang:[^{\s]*\{[^}]*engine_type="([^"]+)"', re.MULTILINE)


def engine_type_for(mode: str) -> str:
    """The `engine_type` label SGLang puts on its metrics for a disaggregation mode."""
    return {"prefill": "prefill", "decode": "decode"}.get(mode, "unified")


def _mode_from_metrics(client: httpx.Client, base_url: str, expected_mode: str) -> Observation:
    """A server started with an API key answers /model_info only with the key, which the gate does
    not hold (systemd 252 gives ExecStartPost= no readable credential). /metrics stays open and its
    series carry the engine_type label, which names the same mode."""
    status, text = _get(client, f"{base_url}/metrics", METRICS_MAX_BYTES)
    types = set(_ENGINE_TYPE.findall(text)) if status == 200 and isinstance(text, str) else set()
    expected = engine_type_for(expected_mode)
    if types == {expected}:
        return Observation(True, f"{base_url} healthy, /metrics engine_type={expected}")
    seen = ",".join(sorted(types)) or "none"
    return Observation(False, f"{base_url}/model_info needs the API key and /metrics shows engine_type={seen}, "
                              f"expected {expected}")


def worker_observation(client: httpx.Client, base_url: str, expected_mode: str) -> Observation:
    try:
        status, _ = _get(client, f"{base_url}/health")
        if status != 200:
            return Observation(False, f"GET {base_url}/health answered {status}")
        source = "model_info"
        status, info = _get(client, f"{base_url}/{source}")
        if status == 401:
            return _mode_from_metrics(client, base_url, expected_mode)
        if status == 200 and isinstance(info, dict) and "disaggregation_mode" not in info:
            # SGLang before 0.5.23 (0.5.17 on the GPU test machines) leaves the mode out of /model_info;
            # /server_info, the server's arguments, has it in every release.
            source = "server_info"
            status, info = _get(client, f"{base_url}/{source}")
    except _Unreachable as exc:
        return Observation(False, f"{base_url} unreachable: {exc}")
    except _Unread as exc:
        return Observation(False, str(exc))
    if status != 200 or not isinstance(info, dict):
        return Observation(False, f"GET {base_url}/{source} answered {status}" +
                           ("" if status != 200 else f" with {shown(info)}, expected a JSON object"))
    mode = info.get("disaggregation_mode")
    if mode != expected_mode:
        said = mode if isinstance(mode, str) and len(mode) < 40 else shown(mode)
        return Observation(False, f"{base_url}/{source} reports disaggregation_mode={said}, expected {expected_mode}")
    return Observation(True, f"{base_url} healthy, disaggregation_mode={mode}")


def router_observation(client: httpx.Client, base_url: str, expected_workers: int) -> Observation:
    try:
        status, body = _get(client, f"{base_url}/readiness")
    except _Unreachable as exc:
        return Observation(False, f"{base_url} unreachable: {exc}")
    except _Unread as exc:
        return Observation(False, str(exc))
    counts = worker_counts(body, f"{base_url}/readiness")
    if isinstance(counts, Mismatch):
        return Observation(False, f"{counts.observed}; expected {counts.expected}")
    healthy, total = counts.healthy_workers, counts.total_workers
    if status == 200 and healthy == total == expected_workers:
        return Observation(True, f"{base_url}/readiness: {healthy}/{total} workers healthy")
    if healthy is None and counts.reason:
        # smg's 503 says why instead of counting: "insufficient healthy workers" (no Ready prefill and decode
        # pair yet) or "draining" (it got SIGTERM).
        return Observation(False, f"{base_url}/readiness answered {status}: {counts.reason}, expected "
                                  f"{expected_workers}/{expected_workers} workers healthy")
    return Observation(
        False,
        f"{base_url}/readiness answered {status} with {healthy}/{total} workers healthy, expected {expected_workers}",
    )


def probe_for(dep: Deployment, role: Role, client: httpx.Client, server: str | None = None) -> Probe:
    """The readiness probe of a role, or of the named server (a multi-host deployment has several per role;
    a gate on another host reaches it at its cluster address). The router counts every server."""
    if role == "router":
        url, expected = role_url(dep, "router"), len(servers(dep))
        return lambda: router_observation(client, url, expected)
    if server is None and dep.multi_host:
        names = ", ".join(s.name for s in servers(dep, role)) or "none"
        raise ValueError(f"deployment {dep.name} spans hosts: name the {role} server with --server (its {role} "
                         f"servers: {names})")
    if server is not None:
        placed = server_named(dep, server)
        if placed is None or placed.role != role:
            names = ", ".join(s.name for s in servers(dep, role))
            raise ValueError(
                f"deployment {dep.name} has no {role} server named {server!r}; its {role} servers: {names}")
        url = placed.url
    else:
        url = role_url(dep, role)
    mode = disaggregation_mode(role)
    return lambda: worker_observation(client, url, mode)


def watched(probe: Probe, main: MainProcess | None) -> Probe:
    """`probe`, which first raises MainProcessGone when the unit's main process has exited: a dead worker's
    port refuses connections, which would read as "still loading" until the deadline."""

    def checked() -> Observation:
        check_alive(main)
        return probe()

    return checked


def wait_until_ready(
    probe: Probe,
    timeout: float,
    interval: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_change: Callable[[Observation], None] | None = None,
) -> Observation:
    """Probe until ready or until `timeout` seconds have passed; return the last observation."""
    deadline = clock() + timeout
    last: Observation | None = None
    while True:
        observation = probe()
        if on_change and (last is None or observation.state != last.state):
            on_change(observation)
        last = observation
        remaining = deadline - clock()
        if observation.ready or remaining <= 0:
            return observation
        sleep(min(interval, remaining))
