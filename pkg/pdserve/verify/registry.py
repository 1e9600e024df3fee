"""How each check gathers its observations before a pure check judges them.

Which checks a deployment has, and where each is made: pdserve.verify.hosts.checks_for.

A gatherer reads the host only through the run's Context (pdserve.verify.context); the judgement is in
pdserve.verify.checks, where the tests feed it recorded observations.
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.probes import cgroups, chat, kernel_log, net, nvml, procs, topology
from pdserve.probes import versions as version_probe
from pdserve.probes.metrics import MetricsObs
from pdserve.probes.observations import HttpObs, Unavailable
from pdserve.schema import pins
from pdserve.schema.placement import Placed
from pdserve.verify.checks import e2e, exposure, gpu, kernels, metrics, numa, router, servers, units, versions
from pdserve.verify.context import Context
from pdserve.verify.expect import WorkerExpectation
from pdserve.verify.presence import LOOPBACK_OF
from pdserve.verify.result import CheckResult

Check = Callable[[Context], CheckResult]


# ---- units
def _unit_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        exp = ctx.exp
        unit = exp.fallback_unit if role == "fallback" else exp.pd_units[role]
        state = ctx.unit_state(unit)
        journal = ctx.journal(unit) if units.needs_journal(role, state) else []
        check = units.check_fallback_unit if role == "fallback" else units.check_pd_unit
        return check(f"units.{role}", unit, state, journal, ctx.dep.boot_layout)
    return run


# ---- router
def _workers_health(ctx: Context) -> dict[str, HttpObs]:
    """Each worker's own /health, read directly: the router's view may be a health check old."""
    return {key: ctx.get(f"{w.url}/health") for key, w in ctx.exp.servers.items()}


def _router_readiness(ctx: Context) -> CheckResult:
    readiness = ctx.get(f"{ctx.exp.router_url}/readiness")
    return router.check_readiness(ctx.exp, readiness, _workers_health(ctx))


def _router_workers(ctx: Context) -> CheckResult:
    key, _ = ctx.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else None
    listed = ctx.get(f"{ctx.exp.router_url}/workers", headers)
    return router.check_workers(ctx.exp, listed, _workers_health(ctx))


# ---- servers
def _worker(ctx: Context, role: str) -> WorkerExpectation:
    return ctx.exp.workers[role]


def _kv_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        info = ctx.get(f"{w.url}/server_info")
        journal = None
        has_capacity = info.ok and isinstance(info.body, dict) and "max_total_num_tokens" in info.body
        # The journal is the server's host's: from another host only /server_info can say.
        if not has_capacity and ctx.here == w.on_host and not ctx.systemd_reason():
            journal = ctx.grep_journal(w.unit, "max_total_num_tokens=")
        return servers.check_kv(ctx.exp, w, info, journal, None if ctx.here == w.on_host else w.on_host)
    return run


def _server_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        return servers.check_server_args(ctx.exp, w, ctx.get(f"{w.url}/server_info"), ctx.get(f"{w.url}/model_info"))
    return run


def _version_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        return versions.check_version(ctx.exp, w, ctx.get(f"{w.url}/server_info"))
    return run


def _router_version(ctx: Context) -> CheckResult:
    exp = ctx.exp
    pids: set[int] = set()
    if not ctx.systemd_reason():
        main_pid = ctx.unit_state(exp.router_unit).main_pid
        if main_pid > 0:
            pids = {main_pid}
    if not pids:
        pids = procs.listening_pids(ctx.dep.router.port)
    version, source = version_probe.router_version(pids, ctx.options.probe_timeout, pins.ROUTER_DISTRIBUTION)
    return versions.check_router_version(exp, version, source)


# ---- kernels
def kernels_of(ctx: Context, placed: Placed | None) -> CheckResult:
    """The kernels check of one placed SGLang server process: its unit's journal, its share of the TP ranks."""
    assert placed is not None and placed.spec is not None  # the checks are made from the same deployment
    spec = placed.spec
    # Each node's journal holds its own TP ranks only: node n runs n*k .. n*k+k-1 of k per node.
    per_node = spec.tensor_parallel // placed.nnodes
    asked = kernels.KernelsAsked(placed.role, placed.unit, spec.attention_kernels, per_node,
                                 placed.node_rank * per_node)
    if asked.requested != kernel_log.PDSERVE:
        return kernels.check_kernels(asked, None, None)
    state = ctx.unit_state(asked.unit)
    scan = ctx.grep_invocation(state, kernel_log.MARK)
    return kernels.check_kernels(asked, state, kernel_log.parse(list(scan.lines)), scan.incomplete)


# ---- GPUs
# NVML and the processes are this host's: the checks judge the workers placed here (on one host: all).
def _gpu_memory(ctx: Context) -> CheckResult:
    return gpu.check_memory(ctx.local(), nvml.read_gpus())


def _gpu_processes(ctx: Context) -> CheckResult:
    gpus = nvml.read_gpus()
    on_gpus = {pid for g in gpus for pid in g.pids}
    here = ctx.local()
    trees = {key: ctx.worker_pids(w) for key, w in here.workers.items()}
    owners = gpu.trace_owners(here, gpus, {pid: cgroups.unit_of(pid) for pid in on_gpus},
                              {pid: procs.command(pid) for pid in on_gpus}, trees)
    return gpu.check_processes(here, gpus, owners)


# ---- NUMA
def _numa_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        if w.numa_node is None:
            return numa.check_numa(w, None, [])
        cpus = topology.node_cpus(w.numa_node)
        pids = ctx.worker_pids(w) if cpus is not None else set()
        observed = [p for p in (procs.numa_of(pid) for pid in sorted(pids)) if p is not None]
        return numa.check_numa(w, cpus, observed)
    return run


# ---- end to end
def _openai(ctx: Context):
    key, error = ctx.api_key()
    if error:
        raise Unavailable(f"{error}; run as a user that can read it or pass --api-key-file")
    return chat.client(ctx.exp.router_url, key, ctx.options.chat_timeout)


def _e2e(kind: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        exp = ctx.exp
        if kind == "reasoning" and exp.reasoning_parser is None:
            return e2e.check_reasoning(exp, None)  # type: ignore[arg-type]
        if kind == "tools" and exp.tool_call_parser is None:
            return e2e.check_tools(exp, None)  # type: ignore[arg-type]
        with _openai(ctx) as c:
            ctx.before_e2e_request()  # one request each, through the router: metrics.router_requests counts them
            if kind == "chat":
                return e2e.check_chat(exp, chat.plain(c, exp.served_model))
            if kind == "reasoning":
                return e2e.check_reasoning(exp, chat.reasoning(c, exp.served_model))
            if kind == "tools":
                return e2e.check_tools(exp, chat.tools(c, exp.served_model))
            return e2e.check_stream(exp, chat.stream(c, exp.served_model))
    return run


# ---- metrics (after the end-to-end checks, which read them before their first request)
def _metrics_endpoint(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        return metrics.check_endpoint(ctx.exp, role, ctx.metrics(role))
    return run


def _before(ctx: Context, role: str) -> MetricsObs | None:
    """The role's reading before the first end-to-end request; None when none was taken."""
    return (ctx.metrics_baseline or {}).get(role)


def _kv_transfer_failures(ctx: Context) -> CheckResult:
    if not ctx.e2e_requests:
        return metrics.check_transfer_failures(ctx.exp, {}, 0)
    # Every prefill and decode server counts failures (SGLang's prefill.py and decode.py).
    readings = {key: (_before(ctx, key), ctx.metrics(key)) for key in ctx.exp.servers}
    return metrics.check_transfer_failures(ctx.exp, readings, ctx.e2e_requests)


def _router_requests(ctx: Context) -> CheckResult:
    if not ctx.e2e_requests:
        return metrics.check_router_requests(ctx.exp, None, None, 0)
    return metrics.check_router_requests(ctx.exp, _before(ctx, "router"), ctx.metrics("router"), ctx.e2e_requests)


# ---- exposure
def _exposure_ports(ctx: Context) -> CheckResult:
    exp = ctx.local()
    addresses = net.host_addresses()
    listening = {key: w for key, w in exp.workers.items() if w.serves_http}
    targets = [(w.port, f"{key} port") for key, w in listening.items()]
    targets += [(w.bootstrap_port, f"{key} bootstrap port") for key, w in listening.items() if w.bootstrap_port]
    timeout = min(ctx.options.probe_timeout, 2.0)
    results = [net.probe(a, port, what, timeout) for a in addresses for port, what in targets]
    # Each worker port at its own listen address (a wildcard one at loopback): is anything there to expose?
    own = {key: LOOPBACK_OF.get(w.host, w.host) for key, w in listening.items()}
    ports = [(own[key], w.port, f"{key} port") for key, w in listening.items()]
    ports += [(own[key], w.bootstrap_port, f"{key} bootstrap port") for key, w in listening.items() if w.bootstrap_port]
    return exposure.check_ports(exp, addresses, results, [net.probe(a, port, what, timeout) for a, port, what in ports])


def _exposure_auth(ctx: Context) -> CheckResult:
    exp = ctx.exp
    if exp.api_key_file is None and ctx.options.api_key_file is None:
        return exposure.check_auth(exp, None)
    key, error = ctx.api_key()
    if error or key is None:  # no key without an error: none is configured, which the test above returned for
        return exposure.check_auth(exp, None, error)
    return exposure.check_auth(exp, chat.auth(exp.router_url, exp.served_model, key, ctx.options.probe_timeout))


# The checks that compare counters read before the first end-to-end request with the same counters after.
BEFORE_AND_AFTER_E2E = frozenset({"metrics.kv_transfer", "metrics.router_requests"})
