"""What every host of a deployment listens on, and which hosts must reach each listener. Pure.

The port rule (pdserve.schema.rules_ports.distinct_ports), the ports two deployments may not share
(pdserve.schema.rules_across) and the per-host firewall (pdserve.render.firewall) all read this, so a port
the rules accept is exactly a port the firewall opens, to exactly the hosts that use it. A single-host
file's one, implied host binds its servers' ports, the router's, the KV bootstrap port and the fallback's
own port when it has one (no other host reaches them: the firewall is a multi-host file's). A multi-host
file's hosts:
- a server's HTTP API (node 0): the router host(s), which proxy to it and probe /health, and the hosts of
  the other role's servers (node 0), whose readiness gates send their warm-up KV hand-off through it
  (pdserve.launch.handoff);
- a prefill's bootstrap port (node 0): the decode servers' hosts, which fetch the KV hand-off from it, and
  the prefill's own other nodes, whose ranks register there;
- a multi-node server's dist-init ports (node 0): its other nodes (torch's TCPStore, SGLang's ZMQ ports);
- the other nodes' HTTP port (SGLang's health-only server there): nobody from elsewhere.
The router's own port, its metrics port and its probe port (health_check_port) are public endpoints, not
worker ports: the host's own firewall (NixOS: services.pdserve's openFirewall) decides who reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.schema.config import Deployment
from pdserve.schema.topology import DIST_INIT_SPAN, IMPLIED_HOST, Server, peer_role, router_hosts, servers


@dataclass(frozen=True)
class Listener:
    host: str
    field: str  # the field that sets the port, as written
    first: int
    last: int  # a range for the dist-init ports, else == first
    purpose: str
    reached_from: tuple[str, ...]  # hosts that must reach it (loopback always may)
    worker_port: bool = True  # False: the router's public ports, which the deployment's firewall leaves alone

    def overlaps(self, other: Listener) -> bool:
        return self.host == other.host and self.first <= other.last and other.first <= self.last

    @property
    def ports(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def _unique(hosts: list[str], but: str) -> tuple[str, ...]:
    """`hosts` once each, in order, without `but` (a host reaches itself over loopback or its own address)."""
    return tuple(dict.fromkeys(h for h in hosts if h != but))


def _server_listeners(dep: Deployment, server: Server, routers: list[str], decode_hosts: list[str]) -> list[Listener]:
    head = server.hosts[0]
    warmers = [s.hosts[0] for s in servers(dep, peer_role(server.role))]
    found = [Listener(head, f"{server.field}.port", server.port, server.port, f"{server.name} HTTP API",
                      _unique([*routers, *warmers], head))]
    found += [Listener(host, f"{server.field}.port", server.port, server.port,
                       f"{server.name} node {rank} health (SGLang's health-only server)", ())
              for rank, host in enumerate(server.hosts) if rank > 0]
    if server.bootstrap_port is not None:
        field = f"{server.field}.bootstrap_port" if getattr(server.spec, "bootstrap_port", None) else \
            "transfer.bootstrap_port"
        found.append(Listener(head, field, server.bootstrap_port, server.bootstrap_port,
                              f"{server.name} KV bootstrap", _unique([*decode_hosts, *server.hosts[1:]], head)))
    if server.nnodes > 1 and server.dist_init_port is not None:
        found.append(Listener(head, f"{server.field}.dist_init_port", server.dist_init_port,
                              server.dist_init_port + DIST_INIT_SPAN - 1, f"{server.name} dist-init (multi-node TP)",
                              _unique(list(server.hosts[1:]), head)))
    return found


def _implied_host_listeners(dep: Deployment) -> list[Listener]:
    """A single-host file's listeners, in the order its port problems have always been reported in."""
    router = dep.router

    def port(field: str, number: int, purpose: str, worker_port: bool = True) -> Listener:
        return Listener(IMPLIED_HOST, field, number, number, purpose, (), worker_port)

    found = [port(f"{server.field}.port", server.port, f"{server.name} HTTP API") for server in servers(dep)]
    found += [port("router.port", router.port, "router", False),
              port("router.prometheus_port", router.prometheus_port, "router metrics", False),
              port("transfer.bootstrap_port", dep.transfer.bootstrap_port, "prefill KV bootstrap")]
    if router.health_check_port is not None:
        found.append(port("router.health_check_port", router.health_check_port, "router probes", False))
    # By default the fallback takes the router's port: it stands in for the router (Conflicts=), never beside it.
    if dep.fallback_port != router.port:
        found.append(port("fallback.port", dep.fallback_port, "fallback"))
    return found


def listeners(dep: Deployment) -> list[Listener]:
    """Every listener of the deployment, per host."""
    if not dep.multi_host:
        return _implied_host_listeners(dep)
    routers = list(router_hosts(dep))
    decode_hosts = [h for s in servers(dep, "decode") for h in s.hosts]
    found = [item for server in servers(dep) for item in _server_listeners(dep, server, routers, decode_hosts)]
    for host in routers:
        found.append(Listener(host, "router.port", dep.router.port, dep.router.port, "router", (), False))
        found.append(Listener(host, "router.prometheus_port", dep.router.prometheus_port,
                              dep.router.prometheus_port, "router metrics", (), False))
        if dep.router.health_check_port is not None:
            found.append(Listener(host, "router.health_check_port", dep.router.health_check_port,
                                  dep.router.health_check_port, "router probes", (), False))
    return found


def listeners_on(dep: Deployment, host: str) -> list[Listener]:
    return [item for item in listeners(dep) if item.host == host]

