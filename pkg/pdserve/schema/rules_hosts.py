"""Rules of placement: servers and routers on the hosts of a multi-host deployment. Each returns every
problem it finds, named by the field as it is written (prefill[0].hosts, hosts.gpu-a.address, ...).

What a single-host file must hold (its fallback; no placement fields) is checked here too, so the two
shapes of a deployment are told apart in one place. Per-host ports and GPUs: pdserve.schema.rules_ports.
"""

from __future__ import annotations

from collections.abc import Iterator

from pdserve.schema.addresses import is_loopback, is_wildcard
from pdserve.schema.config import WORKER_ROLES, Deployment, WorkerSpec
from pdserve.schema.hosts import ADDRESS_UNSET
from pdserve.schema.problems import MISSING, MISSING_FIX, Problem, Severity
from pdserve.schema.topology import DIST_INIT_SPAN, Node, router_hosts, router_unit, server_unit, servers


def _first_host(dep: Deployment) -> str:
    return next(iter(dep.hosts), "gpu-a")


def one_host_shape(dep: Deployment) -> Iterator[Problem]:
    """A file without [hosts]: one [prefill] and one [decode] table, a fallback, no placement."""
    if dep.multi_host:
        return
    for role in WORKER_ROLES:
        written = getattr(dep, role)
        if isinstance(written, list):
            yield Problem(role, f"(an array of {len(written)} servers)",
                          f"is an array of servers ([[{role}]]), which places servers on hosts, but the file "
                          "declares no [hosts]",
                          f"declare each machine as [hosts.<name>] with its address and give every [[{role}]] "
                          f"hosts = [\"<name>\"], or write one [{role}] table (one host)")
    if dep.router.hosts:
        yield Problem("router.hosts", dep.router.hosts, "places the router, but the file declares no [hosts]",
                      "remove router.hosts (one host: the router runs where the units are rendered), or declare "
                      "the hosts as [hosts.<name>]")
    if dep.fallback is None:
        # As the loader says it of any missing field: a single-host file reads as it always did.
        yield Problem("fallback", None, MISSING, MISSING_FIX)


def multi_host_shape(dep: Deployment) -> Iterator[Problem]:
    """A file with [hosts]: arrays of placed servers, a placed router, no single-server fallback."""
    if not dep.multi_host:
        return
    for role in WORKER_ROLES:
        written = getattr(dep, role)
        if isinstance(written, WorkerSpec):
            yield Problem(role, "(a table)", f"is one [{role}] table, but with [hosts] every server names the "
                          "host(s) it runs on",
                          f"write [[{role}]] (an array of tables, one per server) with hosts = "
                          f"[\"{_first_host(dep)}\"] in each")
        elif not written:
            yield Problem(role, [], "lists no server", f"add a [[{role}]] with hosts = [\"{_first_host(dep)}\"]")
    if not dep.router.hosts:
        yield Problem("router.hosts", [], "names no host: with [hosts] the router runs where it is placed",
                      f"set router.hosts = [\"{_first_host(dep)}\"] (one or more hosts; each router is a full view "
                      "of every server)")
    if dep.fallback is not None:
        yield Problem("fallback", "(a table)", "is the single-server layout of one host; a multi-host deployment "
                      "has none (its servers span hosts, and `pdserve cutover` cannot fold them onto one)",
                      "remove [fallback]")
    if dep.monitoring.enable:
        # pdserve.render.monitoring scrapes one host's prefill, decode and fallback; per-host targets are not
        # rendered yet, and a half-right scrape config would hide the hosts it misses.
        yield Problem("monitoring.enable", True, "is not supported for a multi-host deployment yet: the rendered "
                      "scrape jobs, alerts and dashboard cover one host's servers", "set monitoring.enable = false "
                      "and scrape each server's /metrics (its cluster address and port) from your own Prometheus")
    if dep.fallback is None and dep.boot_layout == "single":
        yield Problem("boot_layout", "single", "boots the single-server fallback, which a multi-host deployment "
                      "has none of", "set boot_layout = \"pd\" or remove it")


def _host_list_problems(dep: Deployment, field: str, hosts: list[str], what: str) -> Iterator[Problem]:
    names = ", ".join(dep.hosts)
    for host in hosts:
        if host not in dep.hosts:
            yield Problem(field, hosts, f"names host {host!r}, which [hosts] does not declare",
                          f"use one of: {names}; or declare [hosts.{host}] with its address")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        yield Problem(field, hosts, f"lists host(s) {twice} twice", f"list each host once ({what})")


def known_hosts(dep: Deployment) -> Iterator[Problem]:
    if not dep.multi_host:
        return
    for server in servers(dep):
        yield from _host_list_problems(dep, f"{server.field}.hosts", list(server.hosts),
                                       "several hosts make one multi-node server, one node per host")
    yield from _host_list_problems(dep, "router.hosts", list(dep.router.hosts), "one router per host")


def addresses_given(dep: Deployment) -> Iterator[Problem]:
    """Every host has its address (the model leaves it unset so that the other rules run: hosts.ADDRESS_UNSET)."""
    for name, host in dep.hosts.items():
        if host.address == ADDRESS_UNSET:
            yield Problem(f"hosts.{name}.address", None, MISSING,
                          "add the IP address the other hosts reach this host at, e.g. address = \"10.0.0.1\"")


def distinct_addresses(dep: Deployment) -> Iterator[Problem]:
    """Addresses are canonical (pdserve.schema.addresses), so two spellings of one address are one string."""
    seen: dict[str, str] = {}
    for name, host in dep.hosts.items():
        if host.address == ADDRESS_UNSET:
            continue
        if host.address in seen:
            yield Problem(f"hosts.{name}.address", host.address, f"is already hosts.{seen[host.address]}.address",
                          "give every host its own cluster address")
        seen.setdefault(host.address, name)


def listen_on_cluster_address(dep: Deployment) -> Iterator[Problem]:
    """Every cross-host listener binds its host's cluster address: the router, the peers and the other
    nodes connect there, and nothing else on the host is opened (not loopback, not 0.0.0.0)."""
    if not dep.multi_host:
        return
    for server in servers(dep):
        # A placed server's spec (PlacedWorkerSpec) has a host; topology types every spec as ServerSpec until
        # issue 39 item 1 gives each placed server its own type.
        written: str | None = getattr(server.spec, "host", None)
        home = dep.hosts.get(server.hosts[0])
        if written is None or home is None or home.address == ADDRESS_UNSET or written == home.address:
            continue
        fix = f"remove {server.field}.host: it listens on hosts.{server.hosts[0]}.address ({home.address})"
        if written in dep.hosts:
            why = "is a host's name; host is the listen address, and hosts places the server"
        elif is_loopback(written):
            why = "is loopback: the router and the peers on the other hosts cannot reach it there"
        elif is_wildcard(written):
            why = "listens on every interface; a worker answers without the router's API key, so it binds only " \
                  "the cluster address"
        else:
            why = f"is not the cluster address of its host {server.hosts[0]} ({home.address})"
        yield Problem(f"{server.field}.host", written, why, fix)
    router = dep.router.host
    if len(router_hosts(dep)) > 1 and not (is_wildcard(router) or is_loopback(router)):
        yield Problem("router.host", router, f"is one address, but routers run on {len(router_hosts(dep))} hosts "
                      f"({', '.join(router_hosts(dep))}); each binds router.host on its own host",
                      "use 0.0.0.0 (or ::) so each router listens on its own host, or place the router on one host")


def multi_node_fields(dep: Deployment) -> Iterator[Problem]:
    """--dist-init-addr only for servers on several hosts; a bootstrap port only for a prefill."""
    for server in servers(dep):
        spec = server.spec
        port = getattr(spec, "dist_init_port", None)
        if server.nnodes > 1 and port is None:
            yield Problem(f"{server.field}.dist_init_port", None,
                          f"is unset, but the server spans {server.nnodes} hosts {list(server.hosts)}: its nodes "
                          "meet at --dist-init-addr, which needs a port",
                          f"set dist_init_port to a free port of {server.hosts[0]}, e.g. 5000 (SGLang also binds "
                          f"the {DIST_INIT_SPAN - 1} ports above it)")
        elif server.nnodes == 1 and port is not None:
            # An error, not a warning: a value the file sets must reach the server or be refused, never be dropped.
            yield Problem(f"{server.field}.dist_init_port", port, "is set on a server of one host; only a multi-node "
                          "server (several hosts) uses --dist-init-addr, so it would go nowhere", "remove it")
        if port is not None and port + DIST_INIT_SPAN - 1 > 65535:
            yield Problem(f"{server.field}.dist_init_port", port, f"leaves no room for the {DIST_INIT_SPAN - 1} "
                          "ports SGLang binds above it", f"use a port at most {65536 - DIST_INIT_SPAN}")
        bootstrap_port = getattr(spec, "bootstrap_port", None)
        if server.role == "decode" and bootstrap_port is not None:
            yield Problem(f"{server.field}.bootstrap_port", bootstrap_port, "is set on a decode server; only a "
                          "prefill binds a bootstrap port (decode learns it from the router)", "remove it")


def unique_units(dep: Deployment) -> Iterator[Problem]:
    """Unit names stay unique across the deployment, so every host's units can be told apart."""
    taken: dict[str, str] = {}
    for server in servers(dep):
        for rank in range(server.nnodes):
            unit = server_unit(dep, Node(server, rank))
            if unit in taken:
                free = next(n for n in range(1, len(taken) + 2)
                            if f"sglang-{dep.name}-{server.role}-{n}" not in taken)
                yield Problem(f"{server.field}.name", server.name, f"gives unit {unit}.service, which "
                              f"{taken[unit]} already has", f"give {server.field} a name of its own "
                              f"(e.g. name = \"{server.role}-{free}\")")
            taken.setdefault(unit, server.field)
    for host in router_hosts(dep):
        unit = router_unit(dep, host)
        if unit in taken:
            yield Problem(f"{taken[unit]}.name", unit, f"gives unit {unit}.service, the router's",
                          "give the server a name that is not \"router\"")


def hosts_in_use(dep: Deployment) -> Iterator[Problem]:
    used = {h for s in servers(dep) for h in s.hosts} | set(dep.router.hosts)
    for name in dep.hosts:
        if name not in used:
            yield Problem(f"hosts.{name}", dep.hosts[name].address or None,
                          "runs nothing: no server and no router names it",
                          f"place a server or the router on it (hosts = [\"{name}\"]), or remove [hosts.{name}]",
                          Severity.WARNING)


RULES = (one_host_shape, multi_host_shape, known_hosts, addresses_given, distinct_addresses, listen_on_cluster_address,
         multi_node_fields, unique_units, hosts_in_use)
