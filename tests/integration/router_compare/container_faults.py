"""The container tier's faults behind each router: one booted systemd container, one deployment rendered by
`pdserve render` and installed unchanged; for sglang-router 0.3.2 a drop-in over the router unit
(legacy_router.legacy_dropin), removed again for smg. The faults, the load and the measurements are the
tier's own (tests/integration/systemd/test_faults_under_load.py); here nothing is asserted, every figure is
kept, and a fault that goes wrong is a row saying so while the rest still run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pdserve.schema.derived import router_shutdown_grace
from tests.integration.router_compare.legacy_router import DROPIN_NAME, LEGACY_MODULE, exec_start_of, legacy_dropin
from tests.integration.router_compare.report import Figures, TierResult, failure_figures
from tests.integration.router_compare.rounds import Say, alternating
from tests.integration.systemd.conftest import REPO, _prerequisites
from tests.integration.systemd.container import booted, fresh_container
from tests.integration.systemd.lab import Lab
from tests.integration.systemd.test_faults_under_load import (
    FAULT_AT,
    HANG_SECONDS,
    LOAD_SECONDS,
    RATE,
    RECOVERY_MARGIN,
    REQUEST_TIMEOUT,
    cutover_and_back,
    describe_refusals,
    hang,
    kill,
    kill_under_load,
    ready_again_s,
    refused_after,
    serving,
    stop_router_then_crash_the_prefill,
    under_load,
)

SMG, LEGACY = "smg", "sglang-router-0.3.2"
MODULES = {SMG: "smg.launch_router", LEGACY: LEGACY_MODULE}



def _measured(summary, load, **extra) -> Figures:
    return {"sent": summary.sent, **failure_figures(load.outcomes),
            "silent": summary.silent, "longest_refused_s": round(summary.longest_refused_s, 3),
            "recovered_s": None if summary.recovered_s is None else round(summary.recovered_s, 3), **extra}


def _windows(prober, since: float) -> list[tuple[float, float]]:
    return [(round(a - since, 2), round(b - since, 2)) for a, b in prober.refused_windows()]


def gate_journal(lab: Lab, role: str, lines: int = 40) -> str:
    """The unit's journal of its last start, without the server's request log: systemd's lines and what the
    gates (leave-routers, wait-ready) said."""
    unit = lab.unit(role)
    script = (f"journalctl --no-pager -o short-monotonic -n 2000 -u {unit} | grep -v -e '\"GET /' -e '\"POST /' "
              f"-e 'PD request arrived' | tail -n {lines}")
    return lab.container.sh(script, check=False).stdout


def kill_worker(lab: Lab, role: str) -> Figures:
    worker = serving(lab)[lab.unit(role)]
    summary, load, _, fault_at, marked_at = kill_under_load(lab, role, worker.main_pid)
    ready_s = ready_again_s(lab, role, worker, fault_at)
    marked = "never" if marked_at is None else f"{marked_at - fault_at:.1f} s"
    # Where the restart's seconds went: systemd's RestartSec=, the ExecStartPre= (leave-routers), then the
    # server's start and the ExecStartPost= gate (its readiness, a KV hand-off, back into the router).
    restarted = lab.states()[lab.unit(role)]
    began, main = (restarted.inactive_exit_us / 1e6 - fault_at, restarted.exec_main_start_us / 1e6 - fault_at)
    return _measured(summary, load, ready_again_s=round(ready_s, 3), restart_began_s=round(began, 3),
                     main_started_s=round(main, 3), journal_tail=gate_journal(lab, role),
                     note=f"router /readiness 503 after {marked}; {role} restart began {began:.1f} s after the kill, "
                          f"its server started at {main:.1f} s (leave-routers took {main - began:.1f} s), its gate "
                          f"passed at {ready_s:.1f} s; {describe_refusals(refused_after(load, fault_at))}")


def prefill_hangs(lab: Lab) -> Figures:
    worker = serving(lab)[lab.unit("prefill")]
    summary, load, _, _ = under_load(lab, "prefill hangs", lambda: hang(lab, worker.main_pid))
    slowest = max(o.seconds for o in load.outcomes)
    restarted = lab.states()[lab.unit("prefill")].main_pid != worker.main_pid
    return _measured(summary, load, ready_again_s=None,
                     note=f"slowest request {slowest:.1f} s; prefill {'restarted' if restarted else 'not restarted'}")


def kill_router(lab: Lab) -> Figures:
    router = serving(lab)[lab.unit("router")]
    summary, load, prober, fault_at = under_load(lab, "kill -9 router", lambda: kill(lab, router.main_pid))
    ready_s = ready_again_s(lab, "router", router, fault_at)
    return _measured(summary, load, ready_again_s=round(ready_s, 3),
                     note=f"refused windows {_windows(prober, fault_at)} (s after the kill); RestartSec="
                          f"{lab.dep.systemd.restart_sec}")  # type: ignore[union-attr]


def router_stop_then_prefill_crash(lab: Lab) -> Figures:
    prefill = serving(lab)[lab.unit("prefill")]
    grace = router_shutdown_grace(lab.dep)  # type: ignore[arg-type]
    stopped: list[float] = []
    summary, load, _, _ = under_load(lab, "router stop + prefill kill -9",
                                     lambda: stopped.append(stop_router_then_crash_the_prefill(lab, prefill.main_pid)),
                                     tail=grace + 2 * RECOVERY_MARGIN)
    ready_s = ready_again_s(lab, "prefill", prefill, stopped[0])
    after = lab.states()
    began = after[lab.unit("prefill")].inactive_exit_us / 1e6 - stopped[0]
    return _measured(summary, load, ready_again_s=round(ready_s, 3),
                     note=f"times from the router's stop (drain {grace} s), the prefill killed 0.5 s into it: its "
                          f"restart began at {began:.1f} s; router {after[lab.unit('router')].describe()}")


def cutover_single_and_back(lab: Lab) -> Figures:
    serving(lab)
    reports: list[dict] = []
    summary, load, prober, fault_at = under_load(lab, "cutover single, then pd",
                                                 lambda: reports.extend(cutover_and_back(lab)), duration=180,
                                                 tail=2 * RECOVERY_MARGIN)
    took = ", ".join(f"{r.get('target')} {r.get('total_seconds')} s (exit {r['exit']})" for r in reports)
    failed = [r["stderr"][-300:] for r in reports if r["exit"] != 0]
    return _measured(summary, load, ready_again_s=None, cutovers=reports,
                     note=f"cutovers: {took}; refused windows {_windows(prober, fault_at)}"
                          + (f"; failed: {failed}" if failed else ""))


FAULTS: dict[str, Callable[[Lab], Figures]] = {
    "kill -9 prefill": lambda lab: kill_worker(lab, "prefill"),
    "kill -9 decode": lambda lab: kill_worker(lab, "decode"),
    f"prefill hangs {HANG_SECONDS:g} s (SIGSTOP)": prefill_hangs,
    "kill -9 router": kill_router,
    "router stop, prefill kill -9 in its drain": router_stop_then_prefill_crash,
    "cutover single, then pd": cutover_single_and_back,
}


def use_router(lab: Lab, router: str, dropin: str) -> None:
    """Put `router` in front of the workers: the drop-in there (0.3.2) or gone (smg), the router restarted
    if it runs, and the deployment serving through it. Checks the router's process runs that module."""
    path = lab.container.path(f"/etc/systemd/system/{lab.unit('router')}.d/{DROPIN_NAME}")
    if router == LEGACY:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dropin, encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    lab.container.run(["systemctl", "daemon-reload"], timeout=60)
    if lab.unit("router") in lab.active():
        lab.container.run(["systemctl", "restart", lab.unit("router")], timeout=200)
    serving(lab)
    # What systemd ran (both routers retitle their process, "smg::router" and "sglang::router", so its
    # /proc cmdline no longer names the module).
    started = lab.container.run(["systemctl", "show", "--property=ExecStart", "--value", lab.unit("router")]).stdout
    if f" -m {MODULES[router]} " not in started:
        raise RuntimeError(f"the router unit runs {started.strip()[:300]}, not {MODULES[router]}")


def prerequisites() -> None:
    """The tier's own checks; a reason to skip ends the benchmark with that reason."""
    try:
        _prerequisites()
    except pytest.skip.Exception as skip:
        raise SystemExit(f"the container tier cannot run here: {skip}") from None


def run(work: Path, faults: list[str], routers: dict[str, str], say: Say) -> TierResult:
    prerequisites()
    tier = TierResult("container", "faults under load: container tier (real systemd 252, stand-in workers)",
                      [f"{RATE:g} chat req/s for {LOAD_SECONDS:g} s per fault, fault at {FAULT_AT:g} s, client "
                       f"timeout {REQUEST_TIMEOUT:g} s, public port probed at 20 Hz; the same container, "
                       "workers and rendered units for both routers, which alternate in order fault by fault"],
                      routers)
    (work / "container").mkdir(parents=True, exist_ok=True)
    (work / "lab").mkdir(parents=True, exist_ok=True)
    with booted(fresh_container(work / "container", REPO)) as box:
        lab = Lab.create(box, work / "lab")
        lab.reset()
        lab.install(lab.variant())
        unit_text = box.path(f"/etc/systemd/system/{lab.unit('router')}").read_text()
        dropin = legacy_dropin(exec_start_of(unit_text), lab.dep)  # type: ignore[arg-type]
        tier.settings.append(f"smg: the router unit as rendered; 0.3.2: {lab.unit('router')}.d/{DROPIN_NAME}")
        tier.artifacts = {"router_unit": unit_text, "legacy_dropin": dropin}
        try:
            def run_one(fault: str, router: str) -> Figures:
                use_router(lab, router, dropin)
                return FAULTS[fault](lab)

            tier.faults += alternating(faults, routers, run_one, lambda text: say(f"container: {text}"), lab.reset)
        finally:
            lab.reset()
    return tier
