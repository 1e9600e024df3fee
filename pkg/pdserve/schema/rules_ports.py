"""Per-host rules: ports distinct on each host, every layout's (GPU sets: schema.rules_gpus); and of a
multi-host deployment, GPUs and NUMA nodes that exist there and RDMA devices where the KV transfer needs
them. Each returns every problem it finds. (The same port on two hosts is fine: each host binds its own.)
"""

from __future__ import annotations

from collections.abc import Iterator

from pdserve.schema.config import Deployment
from pdserve.schema.listeners import Listener, listeners
from pdserve.schema.problems import Problem, Severity
from pdserve.schema.topology import IMPLIED_HOST, Server, servers


def distinct_ports(dep: Deployment) -> Iterator[Problem]:
    """No two listeners of a host share a port (pdserve.schema.listeners says what each host binds)."""
    seen: list[Listener] = []
    for listener in listeners(dep):
        clash = next((other for other in seen if other.overlaps(listener)), None)
        if clash is None:
            seen.append(listener)
        else:
            yield _port_taken(dep, listener, clash)


def _port_taken(dep: Deployment, listener: Listener, clash: Listener) -> Problem:
    value = listener.first if listener.first == listener.last else listener.ports
    if listener.host != IMPLIED_HOST:
        return Problem(listener.field, value, f"is already used on host {listener.host} by {clash.field} "
                       f"({clash.purpose}, port {clash.ports})", "give every listener on a host its own port "
                       "(ports may repeat on different hosts)")
    if listener.field == "fallback.port":
        # Only the router's port may be shared (the fallback stands in for it, clients keep their URL), and
        # that one is no listener of its own.
        return Problem(listener.field, value, f"is already used by {clash.field}; only the router's port may be "
                       "shared, because the units conflict",
                       f"use router.port ({dep.router.port}) so clients keep their URL, or a free port")
    return Problem(listener.field, value, f"is already used by {clash.field}", "give every listener its own port")


def hardware_exists(dep: Deployment) -> Iterator[Problem]:
    """GPUs and NUMA nodes a server names exist on every host it runs on (where [hosts] says what a host has)."""
    for server in servers(dep):
        spec = server.spec
        for host in server.hosts:
            known = dep.hosts.get(host)
            if known is None:
                continue
            if known.gpus is not None and max(spec.gpus) >= known.gpus:
                missing = [g for g in spec.gpus if g >= known.gpus]
                yield Problem(f"{server.field}.gpus", spec.gpus, f"names GPU(s) {missing}, but host {host} has "
                              f"{known.gpus} (hosts.{host}.gpus: indices 0-{known.gpus - 1})",
                              f"use GPUs 0-{known.gpus - 1}, or correct hosts.{host}.gpus")
            layout = known.numa_nodes
            if layout is None or spec.numa_node is None:
                continue
            if spec.numa_node >= len(layout):
                yield Problem(f"{server.field}.numa_node", spec.numa_node, f"does not exist on host {host} "
                              f"(hosts.{host}.numa_nodes lists {len(layout)} node(s): 0-{len(layout) - 1})",
                              f"use a node of 0-{len(layout) - 1}, or remove numa_node (no binding)")
            elif not set(spec.gpus) <= set(layout[spec.numa_node]):
                yield Problem(f"{server.field}.numa_node", spec.numa_node, f"binds CPUs and memory to node "
                              f"{spec.numa_node} of host {host}, but GPU(s) "
                              f"{sorted(set(spec.gpus) - set(layout[spec.numa_node]))} sit on another node",
                              "bind to the node of its GPUs (hosts.<host>.numa_nodes), or remove numa_node",
                              Severity.WARNING)


def host_layouts(dep: Deployment) -> Iterator[Problem]:
    """A host's NUMA layout agrees with itself and with its GPU count: each GPU on one node, none beyond it."""
    for name, host in dep.hosts.items():
        if host.numa_nodes is None:
            continue
        listed = [g for node in host.numa_nodes for g in node]
        twice = sorted({g for g in listed if listed.count(g) > 1})
        if twice:
            yield Problem(f"hosts.{name}.numa_nodes", host.numa_nodes, f"lists GPU(s) {twice} on more than one node",
                          "list each GPU under the one NUMA node it is attached to (`nvidia-smi topo -m`)")
        beyond = sorted({g for g in listed if host.gpus is not None and g >= host.gpus})
        if beyond and host.gpus is not None:  # beyond holds GPUs only where host.gpus is set
            yield Problem(f"hosts.{name}.numa_nodes", host.numa_nodes, f"lists GPU(s) {beyond}, but hosts.{name}.gpus "
                          f"is {host.gpus}", f"list only GPUs 0-{host.gpus - 1}, or correct hosts.{name}.gpus")


# UCX transports that move data only within one host, and those that need RDMA devices (UCX_TLS names).
_LOCAL_TRANSPORTS = {"self", "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "cuda_copy", "cuda_ipc",
                     "gdr_copy", "rocm_copy", "rocm_ipc", "rocm_gdr"}
_RDMA_TRANSPORTS = {"rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "ud", "ud_v", "ud_x",
                    "ud_verbs", "ud_mlx5", "ib", "rdmacm"}


def _ucx_tls(dep: Deployment, server: Server) -> tuple[str, set[str]] | None:
    """(field, transports) of the UCX_TLS a server runs with; None where unset or an exclusion list (^...)."""
    if "UCX_TLS" in server.spec.env:
        field, value = f"{server.field}.env.UCX_TLS", server.spec.env["UCX_TLS"]
    elif "UCX_TLS" in dep.environment:
        field, value = "environment.UCX_TLS", dep.environment["UCX_TLS"]
    else:
        return None
    if value.startswith("^"):
        return None
    return field, {t.strip() for t in value.split(",") if t.strip()}


def _needs_rdma(dep: Deployment, server: Server) -> str | None:
    """Why this server's KV transfer needs RDMA devices named, or None."""
    backend = dep.transfer.backend
    if backend == "mooncake":
        return "transfer.backend mooncake moves KV over RDMA"
    tls = _ucx_tls(dep, server) if backend == "nixl" else None
    if tls and tls[1] & _RDMA_TRANSPORTS:
        return f"{tls[0]} ({','.join(sorted(tls[1] & _RDMA_TRANSPORTS))}) moves KV over RDMA"
    return None


def rdma_devices(dep: Deployment) -> Iterator[Problem]:
    """Where the transfer backend needs RDMA, every server names its devices, and they exist on its hosts; a
    NIXL transfer between hosts needs a UCX transport that leaves the host."""
    if not dep.multi_host:
        return
    hosts_of = {role: {h for s in servers(dep, role) for h in s.hosts} for role in ("prefill", "decode")}
    crosses = hosts_of["prefill"] != hosts_of["decode"] or len(hosts_of["prefill"]) > 1
    said: set[str] = set()
    for server in servers(dep):
        field = f"{server.field}.ib_devices"
        why = _needs_rdma(dep, server)
        if why and not server.ib_devices:
            have = next((dep.hosts[h].ib_devices for h in server.hosts if h in dep.hosts and dep.hosts[h].ib_devices),
                        ["mlx5_0"])
            yield Problem(field, None, f"is unset, and {why}: SGLang needs the RDMA device(s) this server uses "
                          "(--disaggregation-ib-device)", f"set {field} (or transfer.ib_devices) to devices of its "
                          f"host, e.g. {list(have)}")
        for host in server.hosts:
            present = dep.hosts[host].ib_devices if host in dep.hosts else []
            absent = [d for d in server.ib_devices if present and d not in present]
            if absent:
                yield Problem(field if getattr(server.spec, "ib_devices", None) is not None else "transfer.ib_devices",
                              list(server.ib_devices), f"names {absent}, which host {host} does not have "
                              f"(hosts.{host}.ib_devices: {present})", f"use devices of host {host}: {present}")
        tls = _ucx_tls(dep, server) if dep.transfer.backend == "nixl" else None
        if crosses and tls and tls[1] <= _LOCAL_TRANSPORTS and tls[0] not in said:
            said.add(tls[0])
            yield Problem(tls[0], ",".join(sorted(tls[1])), f"lists only transports within one host, but "
                          f"{server.field}'s KV crosses hosts (prefill on {sorted(hosts_of['prefill'])}, decode on "
                          f"{sorted(hosts_of['decode'])})", "add tcp, or an RDMA transport such as rc with "
                          "ib_devices named (e.g. UCX_TLS = \"cuda_copy,cuda_ipc,rc,tcp\")")


RULES = (hardware_exists, host_layouts, rdma_devices)  # distinct_ports runs with pdserve.schema.rules.RULES
