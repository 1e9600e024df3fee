"""The checks of a multi-host deployment, and which host each one must run on.

One host: the checks of pdserve.verify.registry.CHECKS, all made here. Several hosts: one set per server
process, with the same gatherers. A check that reads over the cluster network (a server's /health,
/server_info, /metrics; the router's API and the end-to-end requests through it) is made from wherever
verify runs. A host-local one (systemd's unit state and journal, NVML, the processes' NUMA binding, the
ports a host answers on, the router's loaded version; the router's API or Prometheus listener when it is
bound to loopback) only on its own host: elsewhere it is skipped, saying which host to run
`pdserve verify --host NAME` on. Which host a run stands on: pdserve.verify.here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pdserve.probes import kernel_log
from pdserve.schema.topology import server_named
from pdserve.verify import registry as r
from pdserve.verify.checks import kernels
from pdserve.verify.context import Context
from pdserve.verify.expect import Expectations, WorkerExpectation
from pdserve.verify.result import CheckResult, skipped

Check = r.Check


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


def anywhere(check: Check) -> Callable[[str], Check]:
    def named(check_id: str) -> Check:
        return lambda ctx: replace(check(ctx), id=check_id)
    return named


def _kernels(w: WorkerExpectation) -> Check:
    """pdserve.verify.registry's kernels check for one placed server process (its unit, its spec)."""
    def run(ctx: Context) -> CheckResult:
        server = server_named(ctx.dep, w.server)
        assert server is not None  # expectations come from the same deployment
        # Each node's journal holds its own TP ranks only: node n runs n*k .. n*k+k-1 of k per node.
        per_node = w.tp_size // w.nnodes
        asked = kernels.KernelsAsked(w.role, w.unit, server.spec.attention_kernels, per_node, w.rank * per_node)
        if asked.requested != kernel_log.PDSERVE:
            return kernels.check_kernels(asked, None, None)
        state = ctx.unit_state(w.unit)
        scan = ctx.grep_invocation(state, kernel_log.MARK)
        return kernels.check_kernels(asked, state, kernel_log.parse(list(scan.lines)), scan.incomplete)
    return run


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


def multi_host_checks(exp: Expectations) -> dict[str, Check]:
    """Every check of a multi-host deployment, in the order of the single-host registry."""
    servers = exp.servers
    hosts = sorted({w.on_host for w in exp.workers.values()})
    router_host = exp.router_on

    def via(host: str, check: Check) -> Callable[[str], Check]:
        """Through the router of `host`: from anywhere, or only on that host when it listens on loopback."""
        if exp.router_local:
            return on_host(host, "the router's API on loopback", through(host, check))
        return anywhere(through(host, check))

    def via_router(check: Check) -> Callable[[str], Check]:
        if exp.router_local:
            return on_host(router_host, f"the router's API on loopback ({exp.router_url})", check)
        return anywhere(check)

    router_metrics = (on_host(router_host, "the router's Prometheus listener on loopback", r._metrics_endpoint("router"))
                      if exp.router_metrics_local
                      else anywhere(r._metrics_endpoint("router")))
    router_requests = (on_host(router_host, "the router's Prometheus listener on loopback", r._router_requests)
                       if exp.router_metrics_local else anywhere(r._router_requests))
    plan: list[tuple[str, Callable[[str], Check]]] = [
        *((f"units.{k}", on_host(w.on_host, f"systemd's state of {w.unit}", r._unit_check(k)))
          for k, w in exp.workers.items()),
        *_per_router(exp, lambda host, unit, at: (
            f"units.router{at}", on_host(host, f"systemd's state of {unit}", through(host, r._unit_check("router"))))),
        *_per_router(exp, lambda host, unit, at: (f"router.readiness{at}", via(host, r._router_readiness))),
        *_per_router(exp, lambda host, unit, at: (f"router.workers{at}", via(host, r._router_workers))),
        *((f"kv.{k}", anywhere(r._kv_check(k))) for k in servers),
        *((f"server.{k}", anywhere(r._server_check(k))) for k in servers),
        *((f"kernels.{k}", on_host(w.on_host, f"the journal of {w.unit}", _kernels(w))) for k, w in exp.workers.items()),
        *((f"gpu.memory.{h}", on_host(h, "NVML", r._gpu_memory)) for h in hosts),
        *((f"gpu.processes.{h}", on_host(h, "NVML and the processes", r._gpu_processes)) for h in hosts),
        *((f"numa.{k}", on_host(w.on_host, f"the NUMA binding of {w.unit}'s processes", r._numa_check(k)))
          for k, w in exp.workers.items()),
        *((f"e2e.{kind}", via_router(r._e2e(kind))) for kind in ("chat", "reasoning", "tools", "stream")),
        *((f"metrics.{k}", anywhere(r._metrics_endpoint(k))) for k in servers),
        ("metrics.router", router_metrics),
        ("metrics.kv_transfer", anywhere(r._kv_transfer_failures)),
        ("metrics.router_requests", router_requests),
        *((f"exposure.ports.{h}", on_host(h, "the ports this host answers on", r._exposure_ports)) for h in hosts),
        ("exposure.auth", via_router(r._exposure_auth)),
        *((f"versions.{k}", anywhere(r._version_check(k))) for k in servers),
        *_per_router(exp, lambda host, unit, at: (
            f"versions.router{at}", on_host(host, f"the process of {unit}", through(host, r._router_version)))),
    ]
    return {check_id: make(check_id) for check_id, make in plan}


def checks_for(exp: Expectations) -> dict[str, Check]:
    return multi_host_checks(exp) if exp.multi_host else r.CHECKS
