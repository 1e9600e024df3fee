"""Where every server of a deployment runs: one view of the single-host and the multi-host layouts. Pure.

A single-host file (no `[hosts]`) has one prefill and one decode server on one implied host, named after
their roles (units sglang-<name>-prefill, -decode, as always). A multi-host file has any number of each
(`[[prefill]]`, `[[decode]]`), each on one host or spanning several (multi-node TP: node rank = position
in its `hosts`; node 0 serves HTTP and binds the bootstrap and dist-init ports). The rules, the renderer,
the gates and the firewall all read placements from here, so they agree on names, addresses and ports.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.schema.config import WORKER_ROLES, Deployment, PlacedWorkerSpec, Role, ServerSpec, WorkerSpec
from pdserve.schema.derived import url_of
from pdserve.schema.hosts import ADDRESS_UNSET

# The host of a single-host file: it has no name, it is wherever the units are rendered.
IMPLIED_HOST = ""
# SGLang binds --dist-init-addr's port (torch's TCPStore) on node 0, and with DP attention six ZMQ ports
# right above it (sglang 0.5.23 PortArgs.init_new: port_base = dist_init_port + 1, NUM_DERIVED_PORTS = 6).
DIST_INIT_SPAN = 7


@dataclass(frozen=True)
class Server:
    """One prefill or decode server of the PD layout, where it runs and what it binds."""

    role: Role
    name: str  # unit suffix: "prefill"/"decode" on one host, "<role>-<n>" or its own name on several
    field: str  # where it is written: "prefill" (one host) or "prefill[0]"
    spec: ServerSpec
    hosts: tuple[str, ...]  # (IMPLIED_HOST,) on one host; node rank = position
    listen_host: str
    port: int
    bootstrap_port: int | None  # prefill only
    dist_init_port: int | None  # multi-node only
    ib_devices: tuple[str, ...]

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def url(self) -> str:
        """How the router, the gates and the peers reach its HTTP API (node 0)."""
        return url_of(self.listen_host, self.port)


def _single(dep: Deployment, role: Role, spec: WorkerSpec) -> Server:
    return Server(
        role=role, name=role, field=role, spec=spec, hosts=(IMPLIED_HOST,), listen_host=spec.host, port=spec.port,
        bootstrap_port=dep.transfer.bootstrap_port if role == "prefill" else None, dist_init_port=None,
        ib_devices=tuple(dep.transfer.ib_devices),
    )


def host_address(dep: Deployment, host: str) -> str | None:
    """The cluster address of `host`; None for an unknown host, or one whose address was refused (the
    rules then skip it: pdserve.schema.hosts.ADDRESS_UNSET)."""
    spec = dep.hosts.get(host)
    return spec.address if spec and spec.address != ADDRESS_UNSET else None


def _placed(dep: Deployment, role: Role, index: int, spec: PlacedWorkerSpec) -> Server:
    # An unknown host is a rule's problem (rules_hosts.known_hosts); the view still forms.
    listen = spec.host or host_address(dep, spec.hosts[0]) or "0.0.0.0"
    bootstrap = (spec.bootstrap_port or dep.transfer.bootstrap_port) if role == "prefill" else None
    devices = spec.ib_devices if spec.ib_devices is not None else dep.transfer.ib_devices
    return Server(
        role=role, name=spec.name or f"{role}-{index + 1}", field=f"{role}[{index}]", spec=spec,
        hosts=tuple(spec.hosts), listen_host=listen, port=spec.port, bootstrap_port=bootstrap,
        dist_init_port=spec.dist_init_port, ib_devices=tuple(devices),
    )


def servers(dep: Deployment, role: Role | None = None) -> list[Server]:
    """The PD servers (prefill first, then decode, each in file order), or those of one role. A shape that
    does not fit the file (an array without [hosts], a table with them) gives none: rules_hosts says so."""
    found = []
    for each in WORKER_ROLES if role is None else (role,):
        written = getattr(dep, each)
        if not dep.multi_host and isinstance(written, WorkerSpec):
            found.append(_single(dep, each, written))
        elif dep.multi_host and isinstance(written, list):
            found += [_placed(dep, each, i, spec) for i, spec in enumerate(written)]
    return found


def peer_role(role: Role) -> Role:
    """The other side of the PD pair: decode for a prefill server, prefill for a decode one."""
    return "decode" if role == "prefill" else "prefill"


def server_named(dep: Deployment, name: str) -> Server | None:
    return next((s for s in servers(dep) if s.name == name), None)


@dataclass(frozen=True)
class Node:
    """One server's process on one host: node `rank` of `server.nnodes`."""

    server: Server
    rank: int

    @property
    def host(self) -> str:
        return self.server.hosts[self.rank]


def nodes_on(dep: Deployment, host: str) -> list[Node]:
    """The server processes a host runs, in server order (IMPLIED_HOST: the single-host file's)."""
    return [Node(s, rank) for s in servers(dep) for rank, h in enumerate(s.hosts) if h == host]


def router_hosts(dep: Deployment) -> tuple[str, ...]:
    return tuple(dep.router.hosts) if dep.multi_host else (IMPLIED_HOST,)


def host_names(dep: Deployment) -> list[str]:
    return list(dep.hosts)


def server_unit(dep: Deployment, node: Node) -> str:
    """Unit names are unique across the deployment: node 0 keeps the server's name, the other nodes of a
    multi-node server add -node<rank>."""
    base = f"sglang-{dep.name}-{node.server.name}"
    return base if node.rank == 0 else f"{base}-node{node.rank}"


def router_unit(dep: Deployment, host: str) -> str:
    """sglang-<name>-router; with routers on several hosts each adds its host's name."""
    base = f"sglang-{dep.name}-router"
    return base if len(router_hosts(dep)) <= 1 else f"{base}-{host}"
