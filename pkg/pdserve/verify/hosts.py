"""The checks of a deployment, and which host each one must run on.

One list for every layout, built from the placement with the gatherers of pdserve.verify.registry: one
check per placed process, per host, per router. A single-host file is a one-host deployment: its one,
implied host is where every check is made, and its ids carry no host.

A check that reads over the cluster network is made from where it can reach: the router's API and the
end-to-end requests through it from anywhere; a server's /server_info, /metrics and version from its own host
and the router hosts, the only ones the rendered firewall opens its port to (elsewhere a healthy cluster would
time out). A host-local one (systemd's unit state and journal, NVML, the processes' NUMA binding, the ports a
host answers on, the router's loaded version; the router's API or Prometheus listener when it is bound to
loopback) only on its own host: elsewhere it is skipped, saying which host to run `pdserve verify --host NAME`
on.

Which host a run stands on (choose_host): `--host NAME` decides. Without it: the host whose cluster address
is one of this machine's addresses; when none (or several) is, the first router host, since verify is meant
to run there and it reaches every server over the cluster network. A single-host file has one implied host
and takes no --host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pdserve.schema.config import Deployment
from pdserve.schema.placement import IMPLIED_HOST, place
from pdserve.schema.topology import router_hosts
from pdserve.verify import registry as r
from pdserve.verify.context import Context
from pdserve.verify.expect import Expectations, WorkerExpectation
from pdserve.verify.result import CheckResult, skipped

Check = r.Check


class HostChoiceError(ValueError):
    pass


@dataclass(frozen=True)
class Here:
    host: str
    why: str


def choose_host(dep: Deployment, asked: str | None, addresses: Sequence[str]) -> Here:
    hosts = place(dep).hosts
    if hosts == (IMPLIED_HOST,):
        if asked is not None:
            raise HostChoiceError(f"--host {asked}: deployment {dep.name} describes one host (no [hosts]); "
                                  "leave --host out")
        return Here(IMPLIED_HOST, "one host")
    names = list(dep.hosts)
    if asked is not None:
        if asked not in dep.hosts:
            raise HostChoiceError(
                f"--host {asked}: not a host of deployment {dep.name}; its hosts are {', '.join(names)}")
        return Here(asked, "--host")
    mine = [name for name, spec in dep.hosts.items() if spec.address in addresses]
    if len(mine) == 1:
        return Here(mine[0], f"its cluster address {dep.hosts[mine[0]].address} is this machine's")
    router = router_hosts(dep)[0]
    found = (f"this machine has the cluster addresses of {', '.join(mine)}" if mine
             else "no cluster address of the deployment is this machine's")
    return Here(router, f"{found}: the router's host (pass --host NAME to choose)")


def on_host(host: str, what: str, check: Check) -> Callable[[str], Check]:
    """`check` made only on `host`; elsewhere a skip that names the host and the command to run there."""

    def named(check_id: str) -> Check:
        def run(ctx: Context) -> CheckResult:
            if ctx.here == host:
                return replace(check(ctx), id=check_id)
            return skipped(check_id, f"host-local: it reads {what} on host {host}, which this run (on "
                           f"{ctx.here}) cannot; run `{ctx.options.rerun} --host {host}` on {host}")
        return run
    return named


def past_the_firewall(exp: Expectations, w: WorkerExpectation, check: Check) -> Callable[[str], Check]:
    """`check` of a server's HTTP port, made only where the rendered firewall lets the probe through: the
    server's own host (loopback traffic is accepted) and the router hosts (the only ones its port is opened
    to). Elsewhere it would time out on a healthy cluster, so it is skipped, naming a host that can."""
    reachers = [w.on_host, *(h for h in exp.routers if h != w.on_host)]

    def named(check_id: str) -> Check:
        def run(ctx: Context) -> CheckResult:
            if ctx.here in reachers:
                return replace(check(ctx), id=check_id)
            return skipped(check_id, f"{w.server}'s port {w.port} on {w.on_host} is open only to "
                           f"{', '.join(reachers)} (the rendered firewall), not to {ctx.here}; run "
                           f"`{ctx.options.rerun} --host {reachers[-1]}` on {reachers[-1]}")
        return run
    return named


def from_router_hosts(exp: Expectations, check: Check) -> Callable[[str], Check]:
    """`check` that reads every server's port (e.g. the KV-transfer counters of all): only from a router host."""
    def named(check_id: str) -> Check:
        def run(ctx: Context) -> CheckResult:
            if ctx.here in exp.routers:
                return replace(check(ctx), id=check_id)
            host = next(iter(exp.routers))
            return skipped(check_id, f"it reads every server's port, which the rendered firewall opens only to "
                           f"the router host(s) {', '.join(exp.routers)}; run `{ctx.options.rerun} --host {host}` "
                           f"on {host}")
        return run
    return named


def anywhere(check: Check) -> Callable[[str], Check]:
    def named(check_id: str) -> Check:
        return lambda ctx: replace(check(ctx), id=check_id)
    return named


def _kernels(unit: str) -> Check:
    """pdserve.verify.registry's kernels check for one placed SGLang server process (its unit, its spec)."""
    return lambda ctx: r.kernels_of(ctx, place(ctx.dep).unit(unit))


def through(router_host: str, check: Check) -> Check:
    """`check` made against the router of `router_host` (a deployment with several routers)."""
    def run(ctx: Context) -> CheckResult:
        unit, url = ctx.exp.routers[router_host]
        view = replace(ctx.exp, router_on=router_host, router_unit=unit, router_url=url)
        return check(replace(ctx, exp=view))
    return run


def _per_router(exp: Expectations, make: Callable[[str, str, str], tuple[str, Callable[[str], Check]]]):
    """One check per router: `make(host, unit, check-id suffix)` gives (id, check); ids keep the single
    router's (units.router, router.readiness) when there is one."""
    several = len(exp.routers) > 1
    return [make(host, unit, f".{host}" if several else "") for host, (unit, _) in exp.routers.items()]


def _at(host: str) -> str:
    """A per-host check id's suffix: none for the one implied host of a single-host file."""
    return "" if host == IMPLIED_HOST else f".{host}"


def checks_for(exp: Expectations) -> dict[str, Check]:
    """Every check of the deployment, in one order for every layout: one per placed process (a single-host
    file's are keyed by role, a multi-host file's by unit suffix), one per host for what a host reads of
    itself, one per router."""
    servers = exp.servers
    hosts = sorted({w.on_host for w in exp.workers.values()})
    router_host = exp.router_on
    # Each SGLang server process: (its host, its unit). The placed fallback (a single-host file's) is one
    # more, checked after the router's unit as it always was.
    pd_servers = {k: (w.on_host, w.unit) for k, w in exp.workers.items()}
    fallback = {"fallback": (exp.fallback_on, exp.fallback_unit)} if exp.fallback_unit else {}

    def unit_check(key: str, host: str, unit: str) -> tuple[str, Callable[[str], Check]]:
        return f"units.{key}", on_host(host, f"systemd's state of {unit}", r._unit_check(key))

    def via(host: str, check: Check) -> Callable[[str], Check]:
        """Through the router of `host`, also reading each server's /health: from a router host (the only
        ones the servers' ports are open to), or only on that host when the router listens on loopback."""
        if exp.router_local:
            return on_host(host, "the router's API on loopback", through(host, check))
        return from_router_hosts(exp, through(host, check))

    def via_router(check: Check) -> Callable[[str], Check]:
        if exp.router_local:
            return on_host(router_host, f"the router's API on loopback ({exp.router_url})", check)
        return anywhere(check)

    router_metrics = (on_host(router_host, "the router's Prometheus listener on loopback",
                              r._metrics_endpoint("router"))
                      if exp.router_metrics_local
                      else anywhere(r._metrics_endpoint("router")))
    router_requests = (on_host(router_host, "the router's Prometheus listener on loopback", r._router_requests)
                       if exp.router_metrics_local else anywhere(r._router_requests))
    plan: list[tuple[str, Callable[[str], Check]]] = [
        *(unit_check(k, host, unit) for k, (host, unit) in pd_servers.items()),
        *_per_router(exp, lambda host, unit, at: (
            f"units.router{at}", on_host(host, f"systemd's state of {unit}", through(host, r._unit_check("router"))))),
        *(unit_check(k, host, unit) for k, (host, unit) in fallback.items()),
        *_per_router(exp, lambda host, unit, at: (f"router.readiness{at}", via(host, r._router_readiness))),
        *_per_router(exp, lambda host, unit, at: (f"router.workers{at}", via(host, r._router_workers))),
        *((f"kv.{k}", past_the_firewall(exp, w, r._kv_check(k))) for k, w in servers.items()),
        *((f"server.{k}", past_the_firewall(exp, w, r._server_check(k))) for k, w in servers.items()),
        *((f"gpu.memory{_at(h)}", on_host(h, "NVML", r._gpu_memory)) for h in hosts),
        *((f"gpu.processes{_at(h)}", on_host(h, "NVML and the processes", r._gpu_processes)) for h in hosts),
        *((f"numa.{k}", on_host(w.on_host, f"the NUMA binding of {w.unit}'s processes", r._numa_check(k)))
          for k, w in exp.workers.items()),
        *((f"e2e.{kind}", via_router(r._e2e(kind))) for kind in ("chat", "reasoning", "tools", "stream")),
        *((f"metrics.{k}", past_the_firewall(exp, w, r._metrics_endpoint(k))) for k, w in servers.items()),
        ("metrics.router", router_metrics),
        ("metrics.kv_transfer", from_router_hosts(exp, r._kv_transfer_failures)),
        ("metrics.router_requests", router_requests),
        *((f"exposure.ports{_at(h)}", on_host(h, "the ports this host answers on", r._exposure_ports))
          for h in hosts),
        ("exposure.auth", via_router(r._exposure_auth)),
        *((f"versions.{k}", past_the_firewall(exp, w, r._version_check(k))) for k, w in servers.items()),
        *_per_router(exp, lambda host, unit, at: (
            f"versions.router{at}", on_host(host, f"the process of {unit}", through(host, r._router_version)))),
        *((f"kernels.{k}", on_host(host, f"the journal of {unit}", _kernels(unit)))
          for k, (host, unit) in {**pd_servers, **fallback}.items()),
    ]
    return {check_id: make(check_id) for check_id, make in plan}
