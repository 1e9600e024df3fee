"""The worker gate's last two steps, and the unit's first: out of the routers, warm, back in.

`pdserve leave-routers ROLE` (ExecStartPre=) takes the server out of every router it can reach;
`pdserve wait-ready ROLE --warm-up` (ExecStartPost=) waits for the server's own readiness, then carries
one real KV hand-off through it (launch.handoff) and only then hands it back to the routers
(launch.router_membership). All of it within the gate's one deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from pdserve.launch.gate import Observation, wait_until_ready
from pdserve.launch.handoff import WarmUp
from pdserve.launch.router_membership import Membership, routers_seen_from
from pdserve.probes.credentials import CredentialError, read_key, stand_in_credential
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import API_KEY_CREDENTIAL, MISSING_KEY_STAND_IN
from pdserve.schema.topology import Server, server_named, servers

Say = Callable[[str], None]


def gate_server(dep: Deployment, role: Role, name: str | None) -> Server:
    """The placed server a worker gate stands for: the named one, or a single-host file's only one."""
    found = server_named(dep, name) if name else next(iter(servers(dep, role)), None)
    if found is None or found.role != role:
        names = ", ".join(s.name for s in servers(dep, role)) or "none"
        raise ValueError(f"deployment {dep.name} has no {role} server named {name!r}; its {role} servers: {names}")
    return found


def router_headers(dep: Deployment, say: Say) -> dict[str, str]:
    """The Authorization header smg's worker API needs when the router has an API key; none when it has
    none, or when this unit cannot read it (said, since the router will then refuse with 401)."""
    if dep.router.api_key_file is None:
        return {}
    if stand_in_credential(API_KEY_CREDENTIAL, MISSING_KEY_STAND_IN):
        say(f"cannot manage the routers' workers: the router's key file {dep.router.api_key_file} was not on "
            "this host when the unit started (systemd passed the unit's stand-in); copy it here (mode "
            "0600, owned by root) and restart the unit, or the routers answer 401 and take this server back "
            "on their own health checks, before its warm-up")
        return {}
    try:
        return {"Authorization": f"Bearer {read_key(dep.router.api_key_file, API_KEY_CREDENTIAL)}"}
    except CredentialError as exc:
        say(f"cannot manage the routers' workers: {exc}")
        return {}


def memberships(dep: Deployment, server: Server, client: httpx.Client, say: Say) -> list[Membership]:
    reachable, beyond = routers_seen_from(dep, server.hosts[0])
    if beyond:
        say(f"the routers on {', '.join(beyond)} listen on loopback, out of this host's reach: they take "
            f"{server.name} back on their own health checks, before its warm-up")
    headers = router_headers(dep, say) if reachable else {}
    return [Membership(client, router, server, headers) for router in reachable]


def leave_routers(dep: Deployment, server: Server, client: httpx.Client, timeout: float, say: Say) -> bool:
    """Take `server` out of every reachable router; False when a router that answered kept it."""
    results = [m.leave(timeout) for m in memberships(dep, server, client, say)]
    for result in results:
        say(result.state)
    return all(r.ready for r in results)


def warm_and_rejoin(dep: Deployment, server: Server, probe_client: httpx.Client, handoff_client: httpx.Client,
                    deadline: float, interval: float, peer_wait: float, sleep: Callable[[float], None], say: Say,
                    clock: Callable[[], float] = time.monotonic) -> Observation:
    """A hand-off through `server` (retried every `interval`), then `server` back in every reachable router.

    With no peer ready for `peer_wait` seconds the server goes back unwarmed, said loudly: it cannot serve
    PD without a peer anyway, and the peer, when it starts, carries its own gate's hand-off through both.
    Not ready, with the state that says why, when peers were ready but no hand-off went through by
    `deadline` (the KV transfer path is broken), or when a router that answers did not take it back."""
    warm_up = WarmUp(dep, server, probe_client, handoff_client)

    def until() -> float:
        return deadline if warm_up.met_a_peer else min(deadline, began + peer_wait)

    began = clock()
    warm = Observation(False, "not tried")
    while True:
        warm = wait_until_ready(warm_up, max(until() - clock(), 0), interval, clock=clock, sleep=sleep,
                                on_change=lambda o: say(f"warm-up: {o.state}"))
        # A peer that turned up just before the peer wait ended extends the wait to the gate's deadline.
        if warm.ready or clock() >= until():
            break
    if not warm.ready and warm_up.met_a_peer:
        return Observation(False, f"no KV hand-off went through {server.name} in time: {warm.state}")
    if not warm.ready:
        say(f"warning: no peer was ready within {peer_wait:g} s, so {server.name} goes back to the routers "
            "unwarmed: the first request through it pays SGLang's first-transfer stall, unless its peer's gate "
            "carries a hand-off through both first")
    for membership in memberships(dep, server, probe_client, say):
        joined = membership.join(max(deadline - clock(), 0))
        say(joined.state)
        if not joined.ready:
            return Observation(False, f"{warm.state}, but {joined.state}")
    return Observation(True, warm.state if warm.ready else f"ready, unwarmed: {warm.state}")
