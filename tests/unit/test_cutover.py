"""The cutover state machine against a fake systemd that keeps the rules the real one keeps here:
Conflicts= between the layouts, Wants= + After= from the router to the workers (starting the router
pulls the workers in and it waits for their starts to end; a worker that failed fails the router's
ExecStartPre= gate), After= from the decode to the prefill where they share GPUs, a start that
completes only when the unit is ready, Restart=on-failure loops, and a clock that only moves when
the machine sleeps."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, replace

import pytest

from pdserve.cli.cutover import termination_interrupts
from pdserve.cutover.boot_links import UnitFiles
from pdserve.cutover.edge import Check, GpuProcess, GpuUnknown
from pdserve.cutover.machine import Cutover
from pdserve.cutover.plan import plan_for
from pdserve.cutover.report import EXIT_FAILED, EXIT_ROLLBACK_FAILED, EXIT_SUCCESS, Outcome
from pdserve.probes.systemctl import SystemctlError, UnitState

NEVER = float("inf")


@dataclass
class FakeUnit:
    name: str
    ready_after: float = 5.0  # seconds from start until active; NEVER: the start times out
    start_timeout: float = 60.0
    state: UnitState = None  # type: ignore[assignment]
    started_at: float | None = None

    def __post_init__(self) -> None:
        self.state = UnitState(self.name, load_state="loaded", unit_file_state="disabled")


class FakeSystemd:
    def __init__(self, dep, **ready_after: float):
        self.dep = dep
        self.now = 1000.0
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.smoke_ok: dict[str, bool] = {"pd": True, "single": True}
        self.gpu_holders: list[GpuProcess] | None = []
        self.fail_calls: set[str] = set()
        self.read_only_calls: set[str] = set()  # verbs that fail the way systemctl does on EROFS
        self.files = UnitFiles()  # what the filesystem says about the unit directory (nothing: unknown)
        self.wanted_by: set[str] = set()
        roles = {"prefill": f"sglang-{dep.name}-prefill.service", "decode": f"sglang-{dep.name}-decode.service",
                 "router": f"sglang-{dep.name}-router.service", "fallback": f"sglang-{dep.name}.service"}
        self.role = roles
        self.units = {name: FakeUnit(name, ready_after.get(role, 5.0)) for role, name in roles.items()}
        # The rendered decode unit is After= the prefill when they share GPUs (pdserve.render.units).
        self.decode_after_prefill = bool(set(dep.prefill.gpus) & set(dep.decode.gpus))

    # -- systemd's rules ---------------------------------------------------------------------------
    @property
    def pd(self) -> list[str]:
        return [self.role["prefill"], self.role["decode"], self.role["router"]]

    def _set(self, unit: FakeUnit, **changes) -> None:
        unit.state = replace(unit.state, **changes)

    def _advance(self) -> None:
        for unit in self.units.values():
            st = unit.state
            if st.active_state != "activating" or unit.started_at is None:
                continue
            if unit.name == self.role["router"] and unit.state.sub_state == "waiting":
                workers = [self.units[self.role[r]].state for r in ("prefill", "decode")]
                if any(w.active_state in {"failed", "inactive"} or w.restarting for w in workers):
                    # Wants=, not Requires=: the router's job still runs once the workers' starts have
                    # ended, and its ExecStartPre= gate finds a worker not ready (Restart=on-failure).
                    self._set(unit, sub_state="auto-restart", result="exit-code", n_restarts=st.n_restarts + 1,
                              inactive_exit_us=int(self.now * 1e6))
                    unit.started_at = None
                    continue
                if not all(w.active_state == "active" for w in workers):
                    continue
                unit.started_at = self.now
                self._set(unit, sub_state="start-post", inactive_exit_us=int(self.now * 1e6))
            if unit.name == self.role["decode"] and unit.state.sub_state == "waiting":
                prefill = self.units[self.role["prefill"]].state
                if prefill.active_state == "activating" and not prefill.restarting:
                    continue  # After= (ordering only): the decode's job waits for the prefill's to end
                unit.started_at = self.now
                self._set(unit, sub_state="start-post", inactive_exit_us=int(self.now * 1e6))
            elapsed = self.now - unit.started_at
            if elapsed >= unit.ready_after:
                self._set(unit, active_state="active", sub_state="running")
            elif elapsed >= unit.start_timeout:
                self._set(unit, sub_state="auto-restart", result="exit-code", n_restarts=st.n_restarts + 1)

    def _call(self, verb: str, units) -> None:
        self.calls.append((verb, tuple(units)))
        if verb in self.fail_calls:
            raise SystemctlError(["systemctl", verb], f"{verb} refused by the fake")
        if verb in self.read_only_calls:
            raise SystemctlError(["systemctl", verb], f'Failed to {verb} unit, file "/etc/systemd/system/'
                                 f'multi-user.target.wants/{units[-1]}": Read-only file system')

    def show(self, units):
        self._advance()
        return {u: self.units[u].state for u in units}

    def start(self, units):
        self._call("start", units)
        for name in units:
            targets = [name]
            if name == self.role["router"]:
                targets = [self.role["prefill"], self.role["decode"], name]  # Wants= pulls them in
            for t in targets:
                conflicting = [self.role["fallback"]] if t in self.pd else self.pd
                for c in conflicting:
                    self._set(self.units[c], active_state="inactive", sub_state="dead")
                unit = self.units[t]
                if unit.state.active_state in {"active"}:
                    continue
                unit.started_at = self.now
                waiting = t == self.role["router"] or (t == self.role["decode"] and self.decode_after_prefill)
                self._set(unit, active_state="activating", sub_state="waiting" if waiting else "start-post",
                          result="success",
                          inactive_exit_us=unit.state.inactive_exit_us if waiting else int(self.now * 1e6))

    def stop(self, units, timeout):
        self._call("stop", units)
        for name in units:
            self.units[name].started_at = None
            self._set(self.units[name], active_state="inactive", sub_state="dead")
        self.now += 1.0

    def add_wants(self, target, units):
        self._call("add-wants", (target, *units))
        for name in units:
            self._set(self.units[name], unit_file_state="enabled")
        self.wanted_by.add(target)

    def unit_files(self, states):
        return self.files

    def disable(self, units):
        self._call("disable", units)
        for name in units:
            self._set(self.units[name], unit_file_state="disabled")

    def reset_failed(self, units):
        for name in units:
            if self.units[name].state.active_state == "failed":
                self._set(self.units[name], active_state="inactive", result="success")

    def smoke(self, layout):
        self.calls.append(("smoke", (layout,)))
        self._advance()
        units = self.pd if layout == "pd" else [self.role["fallback"]]
        up = all(self.units[u].state.active_state == "active" for u in units)
        ok = up and self.smoke_ok[layout]
        return Check(ok, f"{layout} {'answered' if ok else 'did not answer'}")

    def gpu_processes(self, gpus):
        if self.gpu_holders is None:
            raise GpuUnknown("no NVML in the fake")
        return [h for h in self.gpu_holders if h.gpu in gpus]

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    # -- helpers for tests -------------------------------------------------------------------------
    def serve(self, layout: str) -> None:
        names = self.pd if layout == "pd" else [self.role["fallback"]]
        for name in names:
            self._set(self.units[name], active_state="active", sub_state="running", inactive_exit_us=1)
            self._set(self.units[name], unit_file_state="enabled")

    def active(self) -> set[str]:
        self._advance()
        return {n for n, u in self.units.items() if u.state.active_state == "active"}

    def verbs(self) -> list[str]:
        return [v for v, _ in self.calls]


@pytest.fixture
def dep(reference_data):
    from pdserve.schema.loading import deployment_from_data

    reference_data["systemd"]["start_timeout_sec"] = 60
    return deployment_from_data(reference_data, "t").deployment


def serving(dep, layout: str | None, files: UnitFiles | None = None, **ready_after: float) -> FakeSystemd:
    """A fake systemd with `layout` up and enabled (None: nothing runs), its unit files as `files` say."""
    fake = FakeSystemd(dep, **ready_after)
    fake.files = files or fake.files
    if layout:
        fake.serve(layout)
    return fake


def run(dep, fake, target="pd", source="/etc/pdserve/t.toml"):
    return Cutover(plan_for(dep, target, source=source), fake).run()


def step(report, name):
    return next(s for s in report.steps if s.name == name)


def test_single_to_pd_succeeds_in_order_and_enables_pd(dep):
    fake = serving(dep, "single", prefill=8, decode=12, router=2)
    report = run(dep, fake)
    assert report.outcome is Outcome.SUCCESS and report.exit_code == EXIT_SUCCESS
    assert report.previous == "single"
    assert fake.active() == set(fake.pd)
    starts = [units for verb, units in fake.calls if verb == "start"]
    # Both workers are started in one call (in parallel), then the router alone.
    assert starts == [(fake.role["prefill"], fake.role["decode"]), (fake.role["router"],)]
    assert fake.verbs().index("stop") < fake.verbs().index("start") < fake.verbs().index("smoke")
    assert fake.units[fake.role["fallback"]].state.unit_file_state == "disabled"
    assert all(fake.units[u].state.unit_file_state == "enabled" for u in fake.pd)
    # The slower worker decides when the workers step ends.
    assert step(report, "start workers").duration_s == pytest.approx(12, abs=1)


def test_never_ready_decode_rolls_back_to_the_fallback(dep):
    fake = serving(dep, "single", decode=NEVER)
    report = run(dep, fake)
    assert report.outcome is Outcome.ROLLED_BACK and report.exit_code == EXIT_FAILED
    workers = step(report, "start workers")
    assert workers.result == "failed" and "decode" in workers.detail and "auto-restart" in workers.detail
    assert fake.active() == {fake.role["fallback"]}
    assert step(report, "rollback: smoke test").result == "ok"
    # A failed cutover leaves boot enablement as it was.
    assert fake.units[fake.role["fallback"]].state.unit_file_state == "enabled"
    assert not {"add-wants", "disable"} & set(fake.verbs())
    assert report.boot is None and report.as_dict()["boot"] is None
    assert not any(s.name == "start router" for s in report.steps)


def sigterm_once(fake: FakeSystemd, verb: str, when) -> list[tuple]:
    """Wrap fake.<verb> so that one SIGTERM arrives right after the first call for which `when(*args)`
    holds; returns the arguments of that call once it has happened."""
    original, sent = getattr(fake, verb), []

    def wrapped(*args):
        result = original(*args)
        if not sent and when(*args):
            sent.append(args)
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    setattr(fake, verb, wrapped)
    return sent


def test_sigterm_during_the_cutover_rolls_back_instead_of_leaving_it_half_done(dep):
    fake = serving(dep, "single")
    sent = sigterm_once(fake, "start", lambda units: True)  # while the PD workers are starting
    before = signal.getsignal(signal.SIGTERM)
    with termination_interrupts():
        report = run(dep, fake)
    assert signal.getsignal(signal.SIGTERM) is before and sent
    assert report.outcome is Outcome.ROLLED_BACK and report.exit_code == EXIT_FAILED
    workers = step(report, "start workers")
    assert workers.result == "failed" and workers.detail == "interrupted (SIGTERM)"
    assert fake.active() == {fake.role["fallback"]}
    assert step(report, "rollback: smoke test").result == "ok"


def test_sigterm_while_reading_the_boot_links_back_keeps_the_serving_cutover(dep):
    fake = serving(dep, "single")
    shows_after_smoke = []

    def boot_steps_second_look(units):  # the boot step reads the units, relinks, then reads them again
        if "smoke" in fake.verbs():
            shows_after_smoke.append(units)
        return len(shows_after_smoke) == 2

    sent = sigterm_once(fake, "show", boot_steps_second_look)
    with termination_interrupts():
        report = run(dep, fake)
    assert sent and len(shows_after_smoke) == 2
    assert report.outcome is Outcome.SUCCESS and report.exit_code == EXIT_SUCCESS
    assert fake.active() == set(fake.pd)
    assert report.boot.result == "changed" and report.boot.at_boot == "unknown (interrupted: SIGTERM)"
    assert "at boot: unknown (interrupted: SIGTERM)" in step(report, "enable at boot").detail
    assert "starts at boot:" not in report.boot.detail  # an unknown reading is not called a mismatch


def shared_gpus(dep):
    """prefill and decode on one GPU (allow_shared_gpus), as on a one-GPU rig."""
    update = {role: getattr(dep, role).model_copy(update={"gpus": [0]}) for role in ("prefill", "decode", "fallback")}
    return dep.model_copy(update={**update, "allow_shared_gpus": True})


def test_on_shared_gpus_the_workers_get_two_start_timeouts_and_the_plan_says_prefill_then_decode(dep):
    shared = shared_gpus(dep)
    plan = plan_for(shared, "pd")
    assert plan.worker_deadline == 2 * 60 + 15 and plan.workers_in_turn
    assert plan_for(dep, "pd").worker_deadline == 60 + 15 and not plan_for(dep, "pd").workers_in_turn
    text = step(Cutover(plan, FakeSystemd(shared)).dry_run(), "start workers").detail
    assert "prefill, then decode (they share GPUs)" in text and "in parallel" not in text
    assert "<= 135 s" in text
    parallel = step(Cutover(plan_for(dep, "pd"), FakeSystemd(dep)).dry_run(), "start workers").detail
    assert "in parallel" in parallel and "<= 75 s" in parallel


def test_on_shared_gpus_a_decode_ready_after_the_prefill_is_not_timed_out(dep):
    shared = shared_gpus(dep)
    # Each within its own 60 s start timeout; the decode only starts once the prefill is ready.
    fake = serving(shared, "single", prefill=50, decode=50)
    report = run(shared, fake)
    assert report.outcome is Outcome.SUCCESS, [s.as_dict() for s in report.steps]
    assert step(report, "start workers").duration_s == pytest.approx(100, abs=1)
    # The same timing on separate GPUs (in parallel) ends at 50 s.
    fake = serving(dep, "single", prefill=50, decode=50)
    assert step(run(dep, fake), "start workers").duration_s == pytest.approx(50, abs=1)


def test_failed_smoke_rolls_back(dep):
    fake = serving(dep, "single")
    fake.smoke_ok["pd"] = False
    report = run(dep, fake)
    assert report.exit_code == EXIT_FAILED
    assert step(report, "smoke test").result == "failed"
    assert fake.active() == {fake.role["fallback"]}


def test_rollback_that_fails_exits_3(dep):
    fake = serving(dep, "single", decode=NEVER, fallback=NEVER)
    report = run(dep, fake)
    assert report.outcome is Outcome.ROLLBACK_FAILED and report.exit_code == EXIT_ROLLBACK_FAILED
    assert step(report, "rollback: start previous workers").result == "failed"


def test_pd_to_single_stops_pd_and_enables_the_fallback(dep):
    fake = serving(dep, "pd")
    report = run(dep, fake, "single")
    assert report.exit_code == EXIT_SUCCESS and report.previous == "pd"
    assert fake.active() == {fake.role["fallback"]}
    assert fake.units[fake.role["fallback"]].state.unit_file_state == "enabled"
    assert all(fake.units[u].state.unit_file_state == "disabled" for u in fake.pd)
    assert not any(s.name == "start router" for s in report.steps)


def test_pd_to_single_failure_restores_pd_router_after_workers(dep):
    fake = serving(dep, "pd", fallback=NEVER)
    report = run(dep, fake, "single")
    assert report.exit_code == EXIT_FAILED
    names = [s.name for s in report.steps]
    assert names.index("rollback: start previous workers") < names.index("rollback: start previous router")
    assert fake.active() == set(fake.pd)


def test_missing_unit_refuses_without_touching_anything(dep):
    fake = serving(dep, "single")
    fake._set(fake.units[fake.role["router"]], load_state="not-found")
    report = run(dep, fake)
    assert report.outcome is Outcome.REFUSED and report.exit_code == EXIT_FAILED
    assert "router" in step(report, "preflight: units installed").detail
    assert not {"start", "stop", "add-wants", "disable"} & set(fake.verbs())


def test_gpu_held_by_a_stranger_refuses(dep):
    fake = serving(dep, "single")
    fake.gpu_holders = [GpuProcess(0, 4242, fake.role["fallback"]), GpuProcess(5, 777, "jupyter.service")]
    report = run(dep, fake)
    assert report.outcome is Outcome.REFUSED
    detail = step(report, "preflight: target GPUs free").detail
    assert "pid 777" in detail and "jupyter.service" in detail and "4242" not in detail
    assert "stop" not in fake.verbs()


def test_gpus_held_by_the_replaced_layout_pass(dep):
    fake = serving(dep, "single")
    fake.gpu_holders = [GpuProcess(g, 4242, fake.role["fallback"]) for g in range(8)]
    report = run(dep, fake)
    assert report.exit_code == EXIT_SUCCESS
    assert step(report, "preflight: target GPUs free").result == "ok"


def test_no_nvml_is_a_skip_with_a_reason_not_a_pass(dep):
    fake = serving(dep, "single")
    fake.gpu_holders = None
    report = run(dep, fake)
    gpu = step(report, "preflight: target GPUs free")
    assert gpu.result == "skipped" and "NVML" in gpu.detail
    assert report.exit_code == EXIT_SUCCESS


def test_already_serving_target_only_smokes_and_enables(dep):
    fake = serving(dep, "pd")
    report = run(dep, fake)
    assert report.outcome is Outcome.UNCHANGED and report.exit_code == EXIT_SUCCESS
    assert "stop" not in fake.verbs() and "start" not in fake.verbs()


def test_from_nothing_failure_leaves_nothing_running(dep):
    fake = FakeSystemd(dep, prefill=NEVER)
    report = run(dep, fake)
    assert report.previous == "none" and report.exit_code == EXIT_FAILED
    assert fake.active() == set()
    assert step(report, "rollback: start previous layout").result == "skipped"


def test_an_enablement_failure_never_rolls_back_a_serving_layout(dep):
    """The fault of issue 13: `systemctl enable` failed after the smoke test and the cutover rolled the
    serving PD layout back (exit 3 when re-enabling failed too). Now PD keeps serving, exit 0."""
    fake = serving(dep, "single")
    fake.fail_calls.add("add-wants")
    report = run(dep, fake)
    assert report.outcome is Outcome.SUCCESS and report.exit_code == EXIT_SUCCESS
    assert fake.active() == set(fake.pd)
    assert not any(s.name.startswith("rollback") for s in report.steps)
    boot = step(report, "enable at boot")
    assert boot.result == "failed" and "add-wants refused" in boot.detail
    assert report.boot.result == "failed" and report.boot.at_boot == "single"
    # Nothing was unlinked after the link failed: the old layout still boots rather than nothing.
    assert "disable" not in fake.verbs()


def test_measurements_cover_the_change_only(dep):
    events = []

    class Probe:
        def start(self):
            events.append(("start", fake.verbs().copy()))

        def stop(self):
            events.append(("stop", fake.verbs().copy()))
            return {"address": "x", "refused_seconds": 1.0}

    fake = serving(dep, "single")
    report = Cutover(plan_for(dep, "pd"), fake, [Probe()]).run()
    assert events[0] == ("start", [])  # before the first stop
    assert events[1][0] == "stop" and "smoke" in events[1][1]
    assert report.as_dict()["refused"] == [{"address": "x", "refused_seconds": 1.0}]


def test_dry_run_changes_nothing_and_lists_the_rollback(dep):
    fake = serving(dep, "single")
    report = Cutover(plan_for(dep, "pd"), fake).dry_run()
    assert report.outcome is Outcome.DRY_RUN and report.exit_code == EXIT_SUCCESS
    assert fake.calls == []
    assert report.steps[-1].name == "on failure: roll back"
    assert fake.role["fallback"] in report.steps[2].detail  # it says what it would stop
    assert f"start {fake.role['fallback']}" in report.steps[-1].detail  # and what it would bring back
