"""Keeping the routers off a worker until its gate has warmed it: out before it starts, back once warm.

smg health-checks the static worker URLs it was started with and takes a worker back the moment its
/health answers 200, which SGLang does before its first KV transfer (and its ~7 s stall) has happened.
So a worker unit's ExecStartPre= removes the worker from every router it can reach (DELETE
/workers/{id}; a removed worker is not probed again), and its ExecStartPost= gate adds it back (POST
/workers, the same url, role and bootstrap port as the router's --prefill/--decode flags) only after
a real hand-off went through it (launch.handoff). Checked with the real smg 1.13.0 binary
(tests/integration/test_gate_warm_up_router.py).

What it cannot cover, and why that is safe:
- a router that is not running when the worker starts: nothing to remove; when it starts it registers
  every server from its own flags (on one host its unit is ordered After= the workers, so systemd holds its
  start while a worker's start job, gate included, runs);
- a router that restarts between the removal and the hand-back: it registers the worker from its flags
  (on one host, again held by After= until the worker's start ends); the hand-back then finds it there
  (409) and is done;
- a keyed router (`router.api_key_file`) whose key the worker unit cannot read: the router answers 401,
  nothing is removed, and the router takes the worker back on its own health check: the warm-up then
  shortens the window in which a client meets the first-transfer stall instead of closing it.
Each of these is said in the unit's journal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from pdserve.launch.gate import Observation
from pdserve.probes import http
from pdserve.probes.answers import shown
from pdserve.schema.addresses import is_loopback
from pdserve.schema.config import Deployment
from pdserve.schema.derived import url_of
from pdserve.schema.topology import IMPLIED_HOST, Server, host_address, router_hosts

# How often a removal or an addition (smg queues both as background jobs, answering 202) is checked.
POLL_S = 0.25


@dataclass(frozen=True)
class RouterRef:
    host: str  # the router's host in the deployment (IMPLIED_HOST on one host)
    url: str


def routers_seen_from(dep: Deployment, here: str) -> tuple[list[RouterRef], list[str]]:
    """(the routers a process on host `here` can reach, the hosts of those it cannot): a router that listens
    on loopback answers only on its own host; a wildcard listener is reached at its host's cluster address."""
    listen, port = dep.router.host, dep.router.port
    reachable, beyond = [], []
    for host in router_hosts(dep):
        if host in (here, IMPLIED_HOST):
            reachable.append(RouterRef(host, url_of(listen, port)))
        elif is_loopback(listen):
            beyond.append(host)
        else:
            wildcard = listen in {"0.0.0.0", "::", ""}
            reachable.append(RouterRef(host, url_of((host_address(dep, host) or listen) if wildcard else listen, port)))
    return reachable, beyond


def worker_spec(server: Server) -> dict[str, object]:
    """POST /workers' body: what the router's --prefill URL BOOTSTRAP / --decode URL flags say of it."""
    spec: dict[str, object] = {"url": server.url, "worker_type": server.role}
    if server.bootstrap_port is not None:
        spec["bootstrap_port"] = server.bootstrap_port
    return spec


class RouterDown(Exception):
    """No answer from the router at all: it is not running (or not reachable from here)."""


class Refused(Exception):
    """The router answered, but not as smg's worker API does; the text names the answer."""


class NeedsKey(Refused):
    """The router's worker API wants its API key (401), which this unit cannot read."""


class Unreadable(ValueError):
    """GET /workers answered something else than smg's worker list; the text says what."""


def listed(body: object, url: str) -> dict | None:
    """The router's entry for the worker at `url` in GET /workers' answer ({"workers": [...]}), or None."""
    workers = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(workers, list):
        raise Unreadable(f"GET /workers answered {shown(body)}, expected {{\"workers\": [...]}}")
    for entry in workers:
        if isinstance(entry, dict) and entry.get("url") == url:
            if not isinstance(entry.get("id"), str):
                raise Unreadable(f"GET /workers lists {url} without an id: {shown(entry)}")
            return entry
    return None


def admitted(entry: dict | None) -> bool:
    """Routable: healthy, and (smg) in status "ready"; sglang-router 0.3.2's entries have no status."""
    return entry is not None and entry.get("is_healthy") is True and entry.get("status", "ready") == "ready"


def described(entry: dict | None) -> str:
    if entry is None:
        return "absent"
    return f"is_healthy={shown(entry.get('is_healthy'))}, status={shown(entry.get('status'))}"


@dataclass
class Membership:
    """One router's view of one worker, through its worker API."""

    client: httpx.Client
    router: RouterRef
    server: Server
    headers: dict[str, str]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _entry(self) -> dict | None:
        """The worker's entry, or None; RouterDown when no connection can be made, Refused for any other
        failure (a router that is there but does not answer in time has not let go of the worker)."""
        seen = http.get(self.client, f"{self.router.url}/workers", headers=self.headers)
        if seen.unreachable:
            raise RouterDown(f"router {self.router.url} unreachable: {seen.error}; when it starts it registers "
                             f"{self.server.name} from its own flags")
        if seen.status is None:
            raise Refused(f"router {self.router.url} did not answer GET /workers: {seen.error}")
        if seen.status == 401:
            raise NeedsKey(self._refusal("GET", seen.status, ""))
        if seen.status != 200 or seen.error:
            raise Refused(self._refusal("GET", seen.status, seen.error or shown(seen.body)))
        try:
            return listed(seen.body, self.server.url)
        except Unreadable as exc:
            raise Refused(f"router {self.router.url}: {exc}") from None

    def _refusal(self, method: str, status: int | None, what: str) -> str:
        if status == 401:
            return (f"router {self.router.url} answered 401 to {method} /workers: its worker API needs the "
                    f"router's API key, which this unit cannot read; the router takes {self.server.name} back on "
                    "its own health check, before the warm-up")
        return f"router {self.router.url} answered {status} to {method} /workers: {what}"

    def leave(self, timeout: float) -> Observation:
        """Remove the worker and wait (up to `timeout`) until the router no longer lists it. Ready: the
        router will not send it requests (removed, never listed, or not running at all)."""
        try:
            entry = self._entry()
        except RouterDown as down:
            return Observation(True, str(down))
        except Refused as refused:  # NeedsKey included: the router keeps the worker
            return Observation(False, str(refused))
        if entry is None:
            return Observation(True, f"router {self.router.url} does not list {self.server.name}")
        # The id is the router's word: quoted whole, so that no `/`, `..` or `?` in it reaches another endpoint.
        worker_id = quote(str(entry.get("id", "")), safe="")
        seen = http.exchange(self.client, "DELETE", f"{self.router.url}/workers/{worker_id}", headers=self.headers)
        if seen.status not in (200, 202, 204, 404):
            return Observation(False, self._refusal("DELETE", seen.status, seen.error or shown(seen.body)))

        def gone() -> Observation:
            now = self._entry()
            # smg drains a removed worker it still holds Ready (5 s in 1.13.0) before it drops the entry; a
            # draining worker gets no new request, which is all leaving needs (the join waits for the entry to go).
            out = now is None or now.get("status") == "draining"
            return Observation(out, f"router {self.router.url} still lists {self.server.name} ({described(now)})")

        done = self._until(gone, timeout)
        return Observation(True, f"router {self.router.url} removed {self.server.name}") if done.ready else done

    def join(self, timeout: float) -> Observation:
        """Add the worker (back) and wait (up to `timeout`) until the router lists it ready and healthy.
        Ready too when the router is not running: it registers the worker from its flags when it starts."""
        try:
            self._entry()
        except (RouterDown, NeedsKey) as cannot:
            # Never removed either (the removal needed the key too): the router readmits it by itself.
            return Observation(True, str(cannot))
        except Refused:
            pass  # a slow or failing answer: tried again below, until the timeout

        def ready() -> Observation:
            now = self._entry()
            if now is None:
                seen = http.exchange(self.client, "POST", f"{self.router.url}/workers", worker_spec(self.server),
                                     headers=self.headers)
                # 409: registered meanwhile (the router restarted and took it from its flags).
                if seen.status not in (200, 201, 202, 409):
                    raise Refused(self._refusal("POST", seen.status, seen.error or shown(seen.body)))
            return Observation(admitted(now), f"router {self.router.url} lists {self.server.name} "
                                              f"({described(now)}), not yet routable")

        done = self._until(ready, timeout)
        return Observation(True, f"router {self.router.url} routes to {self.server.name} again") if done.ready else done

    def _until(self, check: Callable[[], Observation], timeout: float) -> Observation:
        """`check` every POLL_S until it is ready or `timeout` passed; a router that stops answering
        meanwhile ends the wait (RouterDown: it registers the worker from its flags when it is back)."""
        deadline = self.clock() + timeout
        while True:
            try:
                seen = check()
            except RouterDown as down:
                return Observation(True, str(down))
            except Refused as refused:
                seen = Observation(False, str(refused))
            if seen.ready or self.clock() >= deadline:
                return seen
            self.sleep(min(POLL_S, max(deadline - self.clock(), 0)))
