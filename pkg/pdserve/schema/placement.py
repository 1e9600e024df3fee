"""A deployment resolved once into the processes it runs, each placed: one frozen list. Pure.

Every process of a deployment, whatever the file's shape, is one `Placed`: its role, the host it runs on,
its node rank, GPUs, NUMA node, ports, unit name and URL. A single-host file is a one-host deployment: its
servers, router and fallback sit on the implied host (IMPLIED_HOST), with the unit names they always had;
a multi-host file places node 0 .. n-1 of each server on its hosts and a router on each router host (it
has no fallback). `place` is the one function from a Deployment to that list; the commands read it
rather than asking the file's shape (issue 39 item 1, "One placement").
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.schema.config import Deployment, Role, ServerSpec
from pdserve.schema.derived import unit_name, url_of
from pdserve.schema.topology import IMPLIED_HOST as IMPLIED_HOST  # the one host of a single-host file
from pdserve.schema.topology import Node as _Node
from pdserve.schema.topology import (
    Server,
    host_address,
    router_hosts,
    router_unit,
    server_unit,
    servers,
)


@dataclass(frozen=True)
class Placed:
    """One process of the deployment, where it runs and what it binds."""

    role: Role
    name: str  # the server's name ("prefill", "decode-2", ...); "router" and "fallback" for those
    host: str  # IMPLIED_HOST on a single-host file
    node_rank: int  # 0 unless it is a later node of a multi-node server
    nnodes: int
    gpus: tuple[int, ...]  # () for the router
    numa_node: int | None
    listen_host: str
    port: int
    bootstrap_port: int | None  # a prefill's KV bootstrap port (node 0 binds it)
    dist_init_port: int | None  # a multi-node server's
    unit: str  # without ".service"
    url: str  # node 0 and the router: its API; another node: its health-only server on its own address
    spec: ServerSpec | None  # the SGLang server's settings; None for the router

    @property
    def serves_api(self) -> bool:
        """Whether this process answers the server's API (node 0 of a server; the router; the fallback)."""
        return self.node_rank == 0


@dataclass(frozen=True)
class Placement:
    """Every process of one deployment, in order: PD server nodes (prefill first, then decode, each in
    file order, node rank ascending), then the routers (one per router host), then the fallback."""

    deployment: str
    hosts: tuple[str, ...]  # (IMPLIED_HOST,) on a single-host file
    placed: tuple[Placed, ...]

    def on(self, host: str) -> tuple[Placed, ...]:
        """The processes `host` runs, in placement order."""
        return tuple(p for p in self.placed if p.host == host)

    def of_role(self, *roles: Role) -> tuple[Placed, ...]:
        return tuple(p for p in self.placed if p.role in roles)

    def units(self, host: str | None = None) -> tuple[str, ...]:
        """Unit names (without .service) of one host, or of every host."""
        return tuple(p.unit for p in (self.placed if host is None else self.on(host)))

    def unit(self, unit: str) -> Placed | None:
        return next((p for p in self.placed if p.unit == unit), None)


def _node(dep: Deployment, server: Server, rank: int) -> Placed:
    host = server.hosts[rank]
    # Node 0 serves the API; the others only SGLang's health-only server, on their own address.
    url = server.url if rank == 0 else url_of(host_address(dep, host) or server.listen_host, server.port)
    spec = server.spec
    return Placed(
        role=server.role, name=server.name, host=host, node_rank=rank, nnodes=server.nnodes,
        gpus=tuple(spec.gpus), numa_node=spec.numa_node, listen_host=server.listen_host, port=server.port,
        bootstrap_port=server.bootstrap_port, dist_init_port=server.dist_init_port,
        unit=server_unit(dep, _Node(server, rank)), url=url, spec=spec,
    )


def _router(dep: Deployment, host: str) -> Placed:
    return Placed(
        role="router", name="router", host=host, node_rank=0, nnodes=1, gpus=(), numa_node=None,
        listen_host=dep.router.host, port=dep.router.port, bootstrap_port=None, dist_init_port=None,
        unit=router_unit(dep, host), url=url_of(dep.router.host, dep.router.port), spec=None,
    )


def _fallback(dep: Deployment) -> tuple[Placed, ...]:
    spec = dep.fallback
    if spec is None:
        return ()
    return (Placed(
        role="fallback", name="fallback", host=IMPLIED_HOST, node_rank=0, nnodes=1, gpus=tuple(spec.gpus),
        numa_node=spec.numa_node, listen_host=dep.fallback_host, port=dep.fallback_port, bootstrap_port=None,
        dist_init_port=None, unit=unit_name(dep, "fallback"), url=url_of(dep.fallback_host, dep.fallback_port),
        spec=spec,
    ),)


def place(dep: Deployment) -> Placement:
    """The deployment's processes, placed. A file whose shape does not fit (an array without [hosts], a
    table with them) places no PD servers: the rules say so (pdserve.schema.rules_hosts)."""
    nodes = tuple(_node(dep, server, rank) for server in servers(dep) for rank in range(server.nnodes))
    routers = tuple(_router(dep, host) for host in router_hosts(dep))
    fallback = _fallback(dep) if not dep.hosts else ()
    hosts = tuple(dep.hosts) or (IMPLIED_HOST,)
    return Placement(deployment=dep.name, hosts=hosts, placed=(*nodes, *routers, *fallback))


def role_url(dep: Deployment, role: Role) -> str:
    """The API URL of a role's process: a single-host file's one; a multi-host file's first (its first
    server of that role, its first router host's router)."""
    found = next((p.url for p in place(dep).of_role(role) if p.serves_api), None)
    if found is None:
        raise ValueError(f"deployment {dep.name} runs no {role}")
    return found
