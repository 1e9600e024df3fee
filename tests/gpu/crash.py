"""A worker's kill -9 under load, as it happens on a host: the worker's process group dies, the router
keeps running, systemd starts the worker again after RestartSec and its gate decides when it is back.
Meanwhile a bounded chat load runs through the public port and a prober watches that port.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tests.gpu.load import ChatLoad, CrashSummary, PortProber, succeeding_again, summarize, timeline
from tests.gpu.pd_run import PDRun


@dataclass(frozen=True)
class CrashPlan:
    role: str = "prefill"
    rate: float = 4.0  # chat requests per second
    before_s: float = 10.0  # load before the kill
    request_timeout_s: float = 120.0  # beyond the router's retry budget: the router decides, not the client
    streak: int = 8  # requests in a row that must succeed after the restart before the load stops
    tail_max_s: float = 90.0  # at most this long after the restart's gate for that streak
    ready_timeout_s: float = 400.0  # the restarted worker's gate


@dataclass(frozen=True)
class CrashResult:
    summary: CrashSummary
    old_pid: int
    new_pid: int
    restart_ready_after_start_s: float  # the restarted worker: process start to gate passed
    load_s: float
    timeline: list[list]  # every request: [sent, ended] s after the kill, cause


def read_key(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8").strip()


def kill_under_load(run: PDRun, plan: CrashPlan, model: str) -> CrashResult:
    router = urlsplit(run.url("router"))
    key_file = run.deployment.router.api_key_file
    key = read_key(key_file) if key_file else "none"
    prober = PortProber(router.hostname, router.port).start()
    load = ChatLoad(f"{run.url('router')}/v1", key, model, rate=plan.rate, timeout=plan.request_timeout_s,
                    max_duration=plan.before_s + plan.ready_timeout_s + plan.tail_max_s + 60).start()
    began = time.monotonic()
    ready_at = None
    old_pid = run.procs[plan.role].pid
    try:
        time.sleep(plan.before_s)
        killed_at = run.kill_group(plan.role)
        ready_at = run.restart(plan.role, timeout=plan.ready_timeout_s)
        deadline = ready_at + plan.tail_max_s
        while time.monotonic() < deadline and not succeeding_again(load.snapshot(), ready_at, plan.streak):
            time.sleep(0.5)
    finally:
        outcomes = load.stop()
        prober.stop()
    return CrashResult(
        summary=summarize(outcomes, killed_at, ready_at, prober.samples),
        old_pid=old_pid,
        new_pid=run.procs[plan.role].pid,
        restart_ready_after_start_s=run.ready_after[plan.role],
        load_s=time.monotonic() - began,
        timeline=timeline(outcomes, killed_at),
    )


def table(result: CrashResult, plan: CrashPlan) -> str:
    """The figures as the README records them, one line each."""
    s = result.summary
    causes = ", ".join(f"{n} {c}" for c, n in sorted(s.causes.items(), key=lambda kv: -kv[1])) or "none"

    def sec(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f} s"

    rows = [
        ("load", f"{plan.rate:g} chat req/s for {result.load_s:.0f} s, kill -9 of the {plan.role} group "
                 f"after {plan.before_s:g} s, restart after RestartSec"),
        ("requests sent / ok / failed", f"{s.sent} / {s.ok} / {s.failed}"),
        ("failed by cause", causes),
        ("failed: in flight at the kill / sent after it / before it",
         f"{s.failed_in_flight} / {s.failed_sent_after} / {s.failed_before}"),
        ("longest refused window on the public port", f"{s.longest_refused_s:.2f} s"),
        ("longest time without a successful answer", f"{s.longest_without_success_s:.1f} s"),
        ("kill -> first failed answer", sec(s.first_failure_s)),
        (f"kill -> restarted {plan.role} ready (gate passed)", sec(s.worker_ready_s)),
        ("kill -> first successful answer", sec(s.answered_again_s)),
        ("gate passed -> first successful answer", _beyond(s)),
        ("requests sent from kill + this all succeeded", sec(s.all_succeed_from_s)),
        ("slowest successful request sent after the kill", sec(s.slowest_success_after_kill_s)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _beyond(s: CrashSummary) -> str:
    if s.beyond_ready_s is None:
        return "never"
    if s.beyond_ready_s >= 0:
        return f"{s.beyond_ready_s:.1f} s"
    return f"{s.beyond_ready_s:.1f} s (answered before the gate passed)"
