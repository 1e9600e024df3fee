"""What a healthy deployment looks like from outside: derived from the deployment config, nothing else.

One host (no `[hosts]`): one prefill and one decode, keyed by their roles, as always. Several hosts: every
server process (each node of a multi-node server) keyed by its unit's suffix (`prefill-1`, `decode-wide-node1`),
each with the host it runs on, so the registry knows which checks only that host can make.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.schema import pins
from pdserve.schema.addresses import is_loopback
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import disaggregation_mode, url_of
from pdserve.schema.placement import place
from pdserve.schema.topology import IMPLIED_HOST, Node, host_address, router_hosts, router_unit, server_unit, servers

# A server that cannot hold one request of the default context is unusable; the floor defaults to it.
DEFAULT_KV_FLOOR = 65536


@dataclass(frozen=True)
class WorkerExpectation:
    role: Role
    unit: str
    url: str
    host: str
    port: int
    mode: str
    gpus: tuple[int, ...]
    tp_size: int
    mem_fraction_static: float
    chunked_prefill_size: int | None
    numa_node: int | None
    allow_non_loopback: bool
    server: str = ""  # the server's name (pdserve.schema.topology.Server.name)
    id: str = ""  # check-id suffix: the role on one host, the unit's suffix (prefill-1, decode-2-node1) on several
    field: str = ""  # where the deployment file sets it: "prefill" or "prefill[0]"
    on_host: str = IMPLIED_HOST  # the host this process runs on ("" on one host: wherever verify runs)
    rank: int = 0  # node rank of a multi-node server; only node 0 serves HTTP
    nnodes: int = 1
    bootstrap_port: int | None = None  # a prefill's

    @property
    def serves_http(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Expectations:
    name: str
    served_model: str
    context_length: int | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    workers: dict[str, WorkerExpectation]
    router_url: str
    router_host: str
    router_unit: str
    fallback_unit: str  # "" when nothing is placed as the fallback (a multi-host file)
    bootstrap_port: int
    api_key_file: str | None
    kv_floor: int
    sglang_version: str = pins.SGLANG_VERSION
    router_version: str = pins.ROUTER_VERSION
    # worker id or "router" -> the /metrics URL Prometheus scrapes (the router's: its Prometheus listener)
    metrics_urls: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)  # host name -> cluster address; empty on one host
    router_on: str = IMPLIED_HOST  # the host whose router the router and end-to-end checks go through
    # Every router: host -> (its unit, its URL), each a full view of the servers (one host: the implied one's).
    routers: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The router's API / its Prometheus listener on loopback: only the router's own host reaches it.
    router_local: bool = True
    router_metrics_local: bool = True
    fallback_on: str = IMPLIED_HOST  # the placed fallback's host

    @property
    def multi_host(self) -> bool:
        return bool(self.hosts)

    @property
    def servers(self) -> dict[str, WorkerExpectation]:
        """The workers with an HTTP API (node 0 of each server): what the router registers."""
        return {key: w for key, w in self.workers.items() if w.serves_http}

    @property
    def pd_units(self) -> dict[str, str]:
        return {**{key: w.unit for key, w in self.workers.items()}, "router": self.router_unit}

    def on(self, host: str) -> dict[str, WorkerExpectation]:
        """The worker processes `host` runs (on one host: all of them)."""
        return {key: w for key, w in self.workers.items() if w.on_host == host}


def _worker(dep: Deployment, node: Node) -> WorkerExpectation:
    server, spec = node.server, node.server.spec
    unit = server_unit(dep, node)
    return WorkerExpectation(
        role=server.role,
        unit=unit,
        url=server.url,
        host=server.listen_host,
        port=server.port,
        mode=disaggregation_mode(server.role),
        gpus=tuple(spec.gpus),
        tp_size=spec.tensor_parallel,
        mem_fraction_static=spec.mem_fraction_static,
        chunked_prefill_size=spec.chunked_prefill_size,
        numa_node=spec.numa_node,
        # Only a single-host worker has the switch; placed servers listen on their cluster address by rule.
        allow_non_loopback=getattr(spec, "allow_non_loopback", False),
        server=server.name,
        id=unit.removeprefix(f"sglang-{dep.name}-"),  # on one host: its role
        field=server.field,
        on_host=node.host,
        rank=node.rank,
        nnodes=server.nnodes,
        bootstrap_port=server.bootstrap_port,
    )


def router_host_for(dep: Deployment, here: str) -> str:
    """The router the checks go through: this host's when it runs one, else the first router host's."""
    hosts = router_hosts(dep)
    return here if here in hosts else hosts[0]


def expectations(dep: Deployment, kv_floor: int | None = None, here: str = IMPLIED_HOST) -> Expectations:
    """What verify expects of the deployment, seen from `here` (a single-host file: its one, implied host,
    where every listener is reached as it is on a host of several)."""
    workers = {}
    for server in servers(dep):
        for rank in range(server.nnodes):
            w = _worker(dep, Node(server, rank))
            workers[w.id] = w
    router = dep.router
    router_on = router_host_for(dep, here)
    metrics_host = _reachable(router.prometheus_host, router_on, dep)
    metrics = {key: f"{w.url}/metrics" for key, w in workers.items() if w.serves_http}
    # On loopback the router's listener is read on its own host only (elsewhere 127.0.0.1 is another machine).
    if here == router_on or not is_loopback(router.prometheus_host):
        metrics["router"] = f"{url_of(metrics_host, router.prometheus_port)}/metrics"
    prefill = next((w for w in workers.values() if w.role == "prefill"), None)
    fallback = next(iter(place(dep).of_role("fallback")), None)
    return Expectations(
        **_model_expectations(dep, kv_floor),
        workers=workers,
        router_url=url_of(_reachable(router.host, router_on, dep), router.port),
        router_host=router.host,
        router_unit=router_unit(dep, router_on),
        fallback_unit=fallback.unit if fallback else "",
        fallback_on=fallback.host if fallback else IMPLIED_HOST,
        bootstrap_port=prefill.bootstrap_port if prefill and prefill.bootstrap_port else dep.transfer.bootstrap_port,
        api_key_file=router.api_key_file,
        metrics_urls=metrics,
        hosts={name: spec.address for name, spec in dep.hosts.items()},
        router_on=router_on,
        routers={host: (router_unit(dep, host), url_of(_reachable(router.host, host, dep), router.port))
                 for host in router_hosts(dep)},
        router_local=is_loopback(router.host),
        router_metrics_local=is_loopback(router.prometheus_host),
    )


def _model_expectations(dep: Deployment, kv_floor: int | None) -> dict:
    """What the served model makes every server and the router answer with, on one host or several."""
    model = dep.model
    return dict(name=dep.name, served_model=model.served_name or model.path, context_length=model.context_length,
                reasoning_parser=model.reasoning_parser, tool_call_parser=model.tool_call_parser,
                kv_floor=kv_floor if kv_floor is not None else (model.context_length or DEFAULT_KV_FLOOR))


def _reachable(listen: str, host: str, dep: Deployment) -> str:
    """Where another host reaches a listener bound to `listen` on `host`: a wildcard means the host's
    cluster address; an address is itself."""
    if listen in {"0.0.0.0", "::", ""}:
        return host_address(dep, host) or listen
    return listen
