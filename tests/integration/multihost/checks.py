"""What the tier checks on every deployment it runs (its own and the hosts/ examples): listeners on the
cluster addresses, chat completions and KV hand-offs across the links, and each host's firewall.

The firewall's expectations are the issue's words, applied to the placements (which host runs which
node of which server), not read back from the rendered rules: a server's HTTP API (node 0) from the
router host(s) only; the other nodes' HTTP port from no other host; a prefill's bootstrap port from the
decode servers' hosts and its own other nodes; a multi-node server's dist-init ports from its other
nodes; the router's port from anywhere. The rules drop what they block, so a blocked connect times out;
a port the rules let through is accepted, or refused where nothing listens on it (the stand-in binds no
dist-init port): an answer from the host's TCP stack either way.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from pdserve.schema.topology import DIST_INIT_SPAN, host_address, router_hosts
from tests.integration.multihost.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))

from multihost_net import tcp_connect

CONNECT_TIMEOUT = 1.5
CLIENT = "client"  # the root namespace: the operator's machine, on the cluster network but no host of it
PASSED = {"connected", "refused"}


@dataclass(frozen=True)
class Reach:
    what: str
    source: str  # a host name or CLIENT
    address: str
    port: int
    allowed: bool


def connect(cluster: Cluster, source: str, address: str, port: int) -> str:
    if source == CLIENT:
        return tcp_connect(address, port, CONNECT_TIMEOUT)[0]
    return cluster.net[source].connect(address, port, CONNECT_TIMEOUT)[0]


def firewall_paths(cluster: Cluster) -> list[Reach]:
    plan, dep = cluster.plan, cluster.plan.dep
    sources = [*plan.addresses, CLIENT]
    routers = set(router_hosts(dep))
    decode_hosts = {h for s in plan.servers() if s.role == "decode" for h in s.hosts}
    paths: list[Reach] = []

    def each(what: str, host: str, port: int, allowed_from: set[str]) -> None:
        address = host_address(dep, host) or ""
        paths.extend(Reach(what, source, address, port, source in allowed_from)
                     for source in sources if source != host)

    for server in plan.servers():
        head, others = server.hosts[0], set(server.hosts[1:])
        # The routers proxy to it; the other role's servers' gates send their warm-up hand-off through it.
        warmers = {s.hosts[0] for s in plan.servers() if s.role != server.role}
        each(f"{server.name} HTTP API", head, server.port, routers | warmers)
        for rank, host in enumerate(server.hosts[1:], start=1):
            each(f"{server.name} node {rank} HTTP", host, server.port, set())
        if server.bootstrap_port is not None:
            each(f"{server.name} KV bootstrap", head, server.bootstrap_port, decode_hosts | others)
        if server.nnodes > 1 and server.dist_init_port is not None:
            for port in (server.dist_init_port, server.dist_init_port + DIST_INIT_SPAN - 1):
                each(f"{server.name} dist-init {port}", head, port, others)
    for host in routers:
        each("router", host, dep.router.port, set(sources))
    return paths


def wrong_firewall_paths(cluster: Cluster) -> list[str]:
    """Every Reach whose connect's outcome is not what the placements call for (connects run side by
    side: each blocked one waits out its timeout)."""
    paths = firewall_paths(cluster)
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda p: connect(cluster, p.source, p.address, p.port), paths))
    wrong = []
    for path, outcome in zip(paths, outcomes, strict=True):
        if (outcome in PASSED) != path.allowed or (not path.allowed and outcome != "timeout"):
            wanted = "connected or refused" if path.allowed else "timeout (dropped)"
            wrong.append(f"{path.what} ({path.address}:{path.port}) from {path.source}: {outcome}, expected {wanted}")
    return wrong


def listeners_off_their_address(cluster: Cluster) -> list[str]:
    """Every server process binds its own host's cluster address (--host: not loopback, not a wildcard);
    the router its host's address or, as a public endpoint, a wildcard."""
    wrong = []
    for p in cluster.plan.processes:
        address = cluster.plan.addresses[p.host]
        allowed = {address, "0.0.0.0", "::"} if p.role == "router" else {address}
        if p.flag("--host") not in allowed:
            wrong.append(f"{p.name} binds {p.flag('--host')}, not {address}")
    return wrong


def chat(cluster: Cluster, count: int) -> dict[str, float]:
    """`count` chat completions through the router with the official client; each server's (node 0's)
    own count of the requests it answered meanwhile, and each prefill's count of hand-offs served."""
    plan = cluster.plan
    before = {p.name: cluster.served(p) or 0.0 for p in plan.heads}
    handoffs = {p.name: cluster.served(p, "sglang:kv_transfer_latency_ms_count") or 0.0 for p in plan.role("prefill")
                if p.node_rank == 0}
    client = OpenAI(base_url=f"{plan.router.url}/v1", api_key=cluster.api_key if cluster.keyed else "unused",
                    timeout=30, max_retries=0)
    model = plan.dep.model.served_name or plan.dep.model.path
    for index in range(count):
        completion = client.chat.completions.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": f"Say hi ({index})."}])
        message = completion.choices[0].message
        assert message.content or getattr(message, "reasoning_content", None), completion
    served = {p.name: (cluster.served(p) or 0.0) - before[p.name] for p in plan.heads}
    for p in plan.role("prefill"):
        if p.node_rank == 0:
            count = cluster.served(p, "sglang:kv_transfer_latency_ms_count") or 0.0
            served[f"hand-offs from {p.name}"] = count - handoffs[p.name]
    return served


def assert_every_server_served_and_every_hand_off_crossed_hosts(cluster: Cluster, served: dict[str, float],
                                                                requests: int) -> None:
    """What `chat` counted for `requests` requests: every prefill and every decode server (node 0) answered
    some, each role answered all of them, and the prefills' hand-off counts add up to the requests while no
    host runs both roles, so every decode fetched its room from a prefill on another host (a decode host
    reaches a prefill's bootstrap server only over its link)."""
    heads = cluster.plan.heads
    assert all(served[p.name] > 0 for p in heads), served
    for role in ("prefill", "decode"):
        assert sum(served[p.name] for p in heads if p.role == role) == requests, served
    assert sum(v for k, v in served.items() if k.startswith("hand-offs from ")) == requests, served
    assert set(cluster.plan.hosts_of("prefill")).isdisjoint(cluster.plan.hosts_of("decode"))
