"""Which checks exist, how each one gathers its observations, and running them (select, time, retry)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from pdserve.probes import chat, http, net, nvml, procs, systemd
from pdserve.probes import versions as version_probe
from pdserve.probes.observations import HttpObs, Unavailable
from pdserve.schema.config import Deployment
from pdserve.verify.checks import e2e, exposure, gpu, numa, router, servers, units, versions
from pdserve.verify.expect import Expectations, WorkerExpectation
from pdserve.verify.result import CheckResult, Status, skipped

JOURNAL_LINES = 15


@dataclass
class Options:
    probe_timeout: float = 10.0
    chat_timeout: float = 180.0
    api_key_file: str | None = None  # overrides router.api_key_file for reading the key


@dataclass
class Context:
    dep: Deployment
    exp: Expectations
    options: Options
    client: httpx.Client
    _systemd_reason: str | None = field(default=None, init=False)
    _systemd_checked: bool = field(default=False, init=False)

    # ---- shared probes
    def systemd_reason(self) -> str | None:
        if not self._systemd_checked:
            self._systemd_reason, self._systemd_checked = systemd.unavailable_reason(), True
        return self._systemd_reason

    def require_systemd(self) -> None:
        reason = self.systemd_reason()
        if reason:
            raise Unavailable(reason)

    def get(self, url: str, headers: dict[str, str] | None = None) -> HttpObs:
        return http.get(self.client, url, headers)

    def api_key(self) -> tuple[str | None, str | None]:
        """(key, error reading it); (None, None) when no key is configured."""
        path = self.options.api_key_file or self.exp.api_key_file
        if not path:
            return None, None
        try:
            with open(path, encoding="utf-8") as handle:
                key = handle.read().strip()
        except OSError as exc:
            return None, f"cannot read the API key file {path}: {exc.strerror}"
        return (key, None) if key else (None, f"the API key file {path} is empty")

    def role_pids(self, role: str, port: int, unit: str) -> set[int]:
        """A role's processes: its unit's cgroup under systemd, else the listener on its port and its children."""
        if not self.systemd_reason():
            try:
                group = systemd.show(unit, self.options.probe_timeout).get("ControlGroup")
            except Unavailable:
                group = None
            if group:
                pids = set(systemd.cgroup_pids(group))
                if pids:
                    return pids
        roots = procs.listening_pids(port)
        return procs.with_descendants(roots) if roots else set()

    def journal(self, unit: str, lines: int = JOURNAL_LINES) -> list[str]:
        return systemd.journal(unit, lines, self.options.probe_timeout)


Check = Callable[[Context], CheckResult]


# ---- units
def _unit_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        ctx.require_systemd()
        exp = ctx.exp
        unit = exp.fallback_unit if role == "fallback" else exp.pd_units[role]
        props = systemd.show(unit, ctx.options.probe_timeout)
        failed = props.get("ActiveState") == "failed" or props.get("Result", "success") not in ("success", "")
        journal = ctx.journal(unit) if failed or (role != "fallback" and props.get("ActiveState") != "active") else []
        check = units.check_fallback_unit if role == "fallback" else units.check_pd_unit
        return check(f"units.{role}", unit, props, journal, ctx.dep.boot_layout)
    return run


# ---- router
def _workers_health(ctx: Context) -> dict[str, HttpObs]:
    """Each worker's own /health, read directly: the router's view may be a health check old."""
    return {role: ctx.get(f"{w.url}/health") for role, w in ctx.exp.workers.items()}


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
        if not has_capacity and not ctx.systemd_reason():
            journal = systemd.grep_journal(w.unit, "max_total_num_tokens=", ctx.options.probe_timeout)
        return servers.check_kv(ctx.exp, w, info, journal)
    return run


def _server_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        return servers.check_server_args(ctx.exp, w, ctx.get(f"{w.url}/server_info"), ctx.get(f"{w.url}/model_info"))
    return run


def _version_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        return servers.check_version(ctx.exp, w, ctx.get(f"{w.url}/server_info"))
    return run


def _router_version(ctx: Context) -> CheckResult:
    exp = ctx.exp
    pids: set[int] = set()
    if not ctx.systemd_reason():
        main_pid = systemd.show(exp.router_unit, ctx.options.probe_timeout).get("MainPID", "0")
        if main_pid.isdigit() and int(main_pid) > 0:
            pids = {int(main_pid)}
    if not pids:
        pids = procs.listening_pids(ctx.dep.router.port)
    version, source = version_probe.router_version(pids, ctx.options.probe_timeout)
    return versions.check_router_version(exp, version, source)


# ---- GPUs
def _gpu_memory(ctx: Context) -> CheckResult:
    return gpu.check_memory(ctx.exp, nvml.read_gpus())


def _gpu_processes(ctx: Context) -> CheckResult:
    gpus = nvml.read_gpus()
    exp = ctx.exp
    unit_roles = {w.unit: role for role, w in exp.workers.items()}
    trees = {role: ctx.role_pids(role, w.port, w.unit) for role, w in exp.workers.items()}
    owner_of: dict[int, tuple[str | None, str]] = {}
    for pid in {p for g in gpus for p in g.pids}:
        unit = procs.unit_of(pid)
        if unit in unit_roles:
            owner_of[pid] = (unit_roles[unit], unit)
        elif unit is not None:
            owner_of[pid] = ("other", f"unit {unit} ({procs.command(pid)[:60]})")
        else:
            # No service cgroup (no systemd, or started by hand): match the role's process tree.
            role = next((r for r, tree in trees.items() if pid in tree), None)
            owner_of[pid] = (role, f"{role} process tree" if role else procs.command(pid)[:60] or "not in /proc")
    return gpu.check_processes(exp, gpus, owner_of)


# ---- NUMA
def _numa_check(role: str) -> Check:
    def run(ctx: Context) -> CheckResult:
        w = _worker(ctx, role)
        if w.numa_node is None:
            return numa.check_numa(w, None, [])
        cpus = procs.node_cpus(w.numa_node)
        pids = ctx.role_pids(role, w.port, w.unit) if cpus is not None else set()
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
        c = _openai(ctx)
        if kind == "chat":
            return e2e.check_chat(exp, chat.plain(c, exp.served_model))
        if kind == "reasoning":
            return e2e.check_reasoning(exp, chat.reasoning(c, exp.served_model))
        if kind == "tools":
            return e2e.check_tools(exp, chat.tools(c, exp.served_model))
        return e2e.check_stream(exp, chat.stream(c, exp.served_model))
    return run


# ---- exposure
def _exposure_ports(ctx: Context) -> CheckResult:
    exp = ctx.exp
    addresses = net.host_addresses()
    targets = [(w.port, f"{role} port") for role, w in exp.workers.items()]
    targets.append((exp.bootstrap_port, "prefill bootstrap port"))
    results = [net.probe(a, port, what, min(ctx.options.probe_timeout, 2.0)) for a in addresses for port, what in targets]
    return exposure.check_ports(exp, addresses, results)


def _exposure_auth(ctx: Context) -> CheckResult:
    exp = ctx.exp
    if exp.api_key_file is None and ctx.options.api_key_file is None:
        return exposure.check_auth(exp, None)
    key, error = ctx.api_key()
    if error:
        return exposure.check_auth(exp, None, error)
    return exposure.check_auth(exp, chat.auth(exp.router_url, exp.served_model, key, ctx.options.probe_timeout))


CHECKS: dict[str, Check] = {
    "units.prefill": _unit_check("prefill"),
    "units.decode": _unit_check("decode"),
    "units.router": _unit_check("router"),
    "units.fallback": _unit_check("fallback"),
    "router.readiness": _router_readiness,
    "router.workers": _router_workers,
    "kv.prefill": _kv_check("prefill"),
    "kv.decode": _kv_check("decode"),
    "server.prefill": _server_check("prefill"),
    "server.decode": _server_check("decode"),
    "gpu.memory": _gpu_memory,
    "gpu.processes": _gpu_processes,
    "numa.prefill": _numa_check("prefill"),
    "numa.decode": _numa_check("decode"),
    "e2e.chat": _e2e("chat"),
    "e2e.reasoning": _e2e("reasoning"),
    "e2e.tools": _e2e("tools"),
    "e2e.stream": _e2e("stream"),
    "exposure.ports": _exposure_ports,
    "exposure.auth": _exposure_auth,
    "versions.prefill": _version_check("prefill"),
    "versions.decode": _version_check("decode"),
    "versions.router": _router_version,
}


class SelectionError(ValueError):
    pass


def _matches(check_id: str, token: str) -> bool:
    return check_id == token or check_id.startswith(token)


def select(ids: list[str], only: list[str], skip: list[str]) -> dict[str, str | None]:
    """check id -> None (run it) or the reason it is not run. Unknown tokens are a usage error."""
    for token in [*only, *skip]:
        if not any(_matches(i, token) for i in ids):
            raise SelectionError(f"{token!r} matches no check; known ids: {', '.join(ids)}")
    plan: dict[str, str | None] = {}
    for i in ids:
        if only and not any(_matches(i, t) for t in only):
            plan[i] = f"not selected by --only {','.join(only)}"
        elif any(_matches(i, t) for t in skip):
            plan[i] = f"excluded by --skip {','.join(t for t in skip if _matches(i, t))}"
        else:
            plan[i] = None
    return plan


def run_one(check_id: str, check: Check, ctx: Context) -> tuple[CheckResult, str | None]:
    """(result, verifier error or None). Unavailable -> skip; any other exception is our bug (exit 3)."""
    start = time.monotonic()
    error = None
    try:
        result = check(ctx)
    except Unavailable as exc:
        result = skipped(check_id, exc.reason)
    except Exception as exc:  # noqa: BLE001 - a crash in one check must not hide the others' results
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{check_id}: {type(exc).__name__}: {exc} (at {frame.filename}:{frame.lineno})"
        result = CheckResult(check_id, Status.FAIL, f"the verifier crashed: {type(exc).__name__}: {exc}", "",
                             "a bug in pdserve verify: report it with this message and the --json output")
    return result.timed(int((time.monotonic() - start) * 1000)), error


def run(ctx: Context, plan: dict[str, str | None], wait: float = 0.0, interval: float = 2.0,
        checks: dict[str, Check] | None = None, clock=time.monotonic, sleep=time.sleep,
        on_retry: Callable[[list[str], float], None] | None = None) -> tuple[list[CheckResult], list[str]]:
    """Run the selected checks; with `wait`, re-run failing ones until they pass or the deadline passes."""
    checks = checks or CHECKS
    deadline = clock() + wait
    results: dict[str, CheckResult] = {}
    errors: dict[str, str] = {}
    attempts: dict[str, int] = {}
    pending = [i for i, reason in plan.items() if reason is None]
    for i, reason in plan.items():
        if reason is not None:
            results[i] = skipped(i, reason)
    while pending:
        for i in pending:
            result, error = run_one(i, checks[i], ctx)
            attempts[i] = attempts.get(i, 0) + 1
            results[i] = result.timed(result.duration_ms, attempts[i])
            if error:
                errors[i] = error
            else:
                errors.pop(i, None)
        pending = [i for i in pending if results[i].status is Status.FAIL and i not in errors]
        remaining = deadline - clock()
        if not pending or remaining <= 0:
            break
        if on_retry:
            on_retry(pending, remaining)
        sleep(min(interval, remaining))
    return [results[i] for i in plan], list(errors.values())
