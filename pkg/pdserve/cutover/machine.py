"""The cutover between the single-server layout and PD, as a sequence of bounded steps with a way back.

    observe -> preflight -> stop current -> start workers (parallel, wait ready) -> start router
            -> smoke through the public port -> enable at boot, where it can   => success (exit 0)
    any failure before the smoke test passed -> stop what was started -> start what ran before
            -> smoke it                                                        => rolled back (exit 1)
                                                            a rollback step fails => exit 3

Runtime state always changes; boot links only where they are plain links this host lets it write
(not on NixOS, where the configuration's boot_layout decides them). Either way the report names the
line that makes the declared boot_layout agree. Boot links come after a passing smoke test and never
roll back a layout that serves.

Everything that touches the host goes through `Edge` (systemctl, the smoke test, NVML, the clock),
so this module runs unchanged against a fake in the unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pdserve.cutover.boot_links import boot_report, layout_at_boot
from pdserve.cutover.edge import Edge, GpuUnknown, Measurement
from pdserve.cutover.plan import LAYOUTS, Plan, layout_of, preview
from pdserve.cutover.relink import try_relink
from pdserve.cutover.report import Outcome, Report, Step, StepResult
from pdserve.probes.systemctl import SystemctlError, UnitState
from pdserve.schema.boot import Layout, file_line

POLL_INTERVAL_SEC = 0.5
# The boot step's result from boot_links' (changed | unchanged | read-only | failed).
_STEP_RESULTS: dict[str, StepResult] = {"changed": "ok", "unchanged": "ok", "read-only": "skipped"}


class StepFailed(Exception):
    pass


class Skip(Exception):
    """A step that cannot run here; it is reported as skipped with this reason, never as passed."""


class Cutover:
    def __init__(self, plan: Plan, edge: Edge, measurements: Sequence[Measurement] = (),
                 poll_interval: float = POLL_INTERVAL_SEC):
        self.plan = plan
        self.edge = edge
        self.measurements = list(measurements)
        self.poll = poll_interval
        self.report = Report(plan.deployment, plan.target)
        self._t0 = edge.clock()
        self._measuring = False

    # -- timeline ---------------------------------------------------------------------------------

    def _step(self, name: str, action: Callable[[], str]) -> Step:
        """Run one step; its detail is what `action` returns; a StepFailed or SystemctlError fails it."""
        began = self.edge.clock()
        step = Step(name, began - self._t0)
        self.report.steps.append(step)
        try:
            step.detail = action()
        except Skip as skip:
            step.result, step.detail = "skipped", str(skip)
        except (StepFailed, SystemctlError) as exc:
            step.result, step.detail = "failed", str(exc)
        except KeyboardInterrupt as exc:
            # Ctrl-C, or SIGTERM/SIGHUP turned into the same by the command: fail the step, roll back.
            step.result, step.detail = "failed", f"interrupted ({exc.args[0] if exc.args else 'Ctrl-C'})"
        step.duration_s = self.edge.clock() - began
        return step

    def _skip(self, name: str, reason: str) -> None:
        self.report.steps.append(Step(name, self.edge.clock() - self._t0, 0.0, "skipped", reason))

    def _finish(self, outcome: Outcome) -> Report:
        if self._measuring:
            self.report.refusals = [m.stop() for m in self.measurements]
            self._measuring = False
        self.report.outcome = outcome
        self.report.total_s = self.edge.clock() - self._t0
        return self.report

    # -- unit waits -------------------------------------------------------------------------------

    def _wait_active(self, units: Sequence[str], timeout: float, baseline: dict[str, UnitState]) -> str:
        """Poll until every unit is active; fail at the first one that fails, restarts or stops."""
        deadline = self.edge.clock() + timeout
        while True:
            states = self.edge.show(units)
            for name, state in states.items():
                before = baseline.get(name)
                if state.restarting or state.active_state == "failed":
                    raise StepFailed(f"{state.describe()}; see `journalctl -u {name}`")
                started_since = before is None or state.inactive_exit_us != before.inactive_exit_us
                if state.active_state == "inactive" and started_since:
                    raise StepFailed(f"{state.describe()} (it started and stopped); see `journalctl -u {name}`")
            if all(s.active_state == "active" for s in states.values()):
                waited = timeout - (deadline - self.edge.clock())
                return f"{', '.join(units)} active after {waited:.1f} s"
            if self.edge.clock() >= deadline:
                pending = "; ".join(s.describe() for s in states.values() if s.active_state != "active")
                raise StepFailed(f"not active within {timeout:g} s: {pending}; see `journalctl -u` for each")
            self.edge.sleep(self.poll)

    def _start(self, units: Sequence[str], timeout: float) -> str:
        # A unit left failed by an earlier attempt would read as failing again before its new job runs.
        self.edge.reset_failed(units)
        baseline = self.edge.show(units)
        self.edge.start(units)
        return self._wait_active(units, timeout, baseline)

    def _stop(self, units: Sequence[str]) -> str:
        if not units:
            return "nothing to stop"
        self.edge.stop(units, self.plan.stop_deadline)
        left = [s.describe() for s in self.edge.show(units).values() if s.running]
        if left:
            raise StepFailed(f"still running after stop: {'; '.join(left)}")
        return f"stopped {', '.join(units)}"

    def _smoke(self, layout: Layout) -> str:
        check = self.edge.smoke(layout)
        if not check.ok:
            raise StepFailed(check.detail)
        return check.detail

    # -- preflight --------------------------------------------------------------------------------

    def _installed(self, states: dict[str, UnitState]) -> str:
        missing = [f"{n} ({s.load_state})" for n, s in states.items() if not s.installed]
        if missing:
            raise StepFailed(f"not installed: {', '.join(missing)}; fix: `pdserve render --out /etc/systemd/system` "
                             "then `systemctl daemon-reload` (NixOS: enable services.pdserve)")
        return f"{len(states)} units loaded"

    def _gpus_free(self, replaced: Sequence[str]) -> str:
        gpus = self.plan.gpus[self.plan.target]
        try:
            holders = self.edge.gpu_processes(gpus)
        except GpuUnknown as exc:
            raise Skip(f"cannot see GPU processes here: {exc}") from None
        foreign = [h for h in holders if h.unit not in replaced]
        if foreign:
            listed = "; ".join(f"GPU {h.gpu}: pid {h.pid} ({h.unit or 'not in a systemd unit'})" for h in foreign)
            raise StepFailed(f"target GPUs are held by processes outside the layout being replaced: {listed}; "
                             "fix: stop them, or change the deployment's GPUs")
        held = sorted({h.gpu for h in holders})
        return f"GPUs {list(gpus)} free" + (f" (GPUs {held} held by the layout being replaced)" if held else "")

    # -- the cutover ------------------------------------------------------------------------------

    def dry_run(self) -> Report:
        """The steps, and what runs now, without changing anything. Exit 0 when the state was read;
        DRY_RUN_UNKNOWN (exit 4) when systemctl could not say, with the steps in "state unknown" terms."""
        try:
            states = self.edge.show(self.plan.all_units)
        except SystemctlError as exc:
            self.report.state_unknown = str(exc)
            self.report.steps = self._planned(preview(self.plan, None))
            return self._finish(Outcome.DRY_RUN_UNKNOWN)
        running = [n for n, s in states.items() if s.running]
        serving = [n for n, s in states.items() if s.active_state == "active"]
        self.report.previous = layout_of(serving, self.plan)
        self.report.previously_running = serving
        self.report.steps = self._planned(preview(self.plan, running, serving))
        return self._finish(Outcome.DRY_RUN)

    def _planned(self, steps: list[tuple[str, str]]) -> list[Step]:
        return [Step(name, 0.0, 0.0, "planned", detail) for name, detail in steps]

    def run(self) -> Report:
        plan, edge, target = self.plan, self.edge, self.plan.target
        states: dict[str, UnitState] = {}

        def observe() -> str:
            states.update(edge.show(plan.all_units))
            return "; ".join(s.describe() for s in states.values())

        observed = self._step("observe units", observe)
        if observed.result == "failed":
            self.report.state_unknown = observed.detail
            return self._finish(Outcome.REFUSED)
        # Stopped: everything up or coming up. Restored on failure: what was actually serving.
        running = [n for n, s in states.items() if s.running]
        serving = [n for n, s in states.items() if s.active_state == "active"]
        self.report.previous = layout_of(serving, plan)
        self.report.previously_running = serving

        if self._step("preflight: config", lambda: "; ".join(plan.warnings) or "valid, no warnings").result == "failed":
            return self._finish(Outcome.REFUSED)
        if self._step("preflight: units installed", lambda: self._installed(states)).result == "failed":
            return self._finish(Outcome.REFUSED)
        if self._step("preflight: target GPUs free", lambda: self._gpus_free(running)).result == "failed":
            return self._finish(Outcome.REFUSED)

        target_units = plan.units(target)
        if all(states[u].active_state == "active" for u in target_units) and set(running) <= set(target_units):
            return self._already_serving()

        for m in self.measurements:
            m.start()
        self._measuring = True

        started_any = False
        if self._step("stop current layout", lambda: self._stop(running)).result == "failed":
            return self._roll_back(started_any)
        started_any = True
        label = "start workers" if target == "pd" else "start fallback"
        if self._step(label, lambda: self._start(plan.workers[target], plan.worker_deadline)).result == "failed":
            return self._roll_back(started_any)
        if plan.fronts[target] and self._step(
                "start router", lambda: self._start(plan.fronts[target], plan.front_deadline)).result == "failed":
            return self._roll_back(started_any)
        if self._step("smoke test", lambda: self._smoke(target)).result == "failed":
            return self._roll_back(started_any)
        # From here the target serves: nothing below may undo it.
        self._boot_step()
        return self._finish(Outcome.SUCCESS)

    # -- boot links -------------------------------------------------------------------------------

    def _boot_step(self) -> None:
        """Make the target start at boot where this host lets the cutover write the links; report the
        line that declares it either way. Its result never changes the outcome: the smoke test passed."""
        plan = self.plan
        began = self.edge.clock()
        step = Step("enable at boot", began - self._t0)
        self.report.steps.append(step)
        result, detail, nixos = try_relink(plan, self.edge)
        try:
            at_boot = layout_at_boot(self.edge.show(plan.all_units), {lay: plan.units(lay) for lay in LAYOUTS})
        except SystemctlError as exc:
            at_boot = f"unknown ({exc})"
        except KeyboardInterrupt as exc:
            # SIGTERM/SIGHUP here (the command turns them into this) must not end a serving cutover
            # with a traceback: the smoke test passed, only the boot reading is lost.
            at_boot = f"unknown (interrupted: {exc.args[0] if exc.args else 'Ctrl-C'})"
        change = None
        if plan.declared != plan.target:
            change = plan.nixos_change if nixos else file_line(plan.target, plan.source)
        self.report.boot = boot = boot_report(plan.declared, plan.target, result, detail, at_boot, nixos, change,
                                              plan.source)
        step.result = _STEP_RESULTS.get(result, "failed")
        step.detail = boot.summary()
        step.duration_s = self.edge.clock() - began

    def _already_serving(self) -> Report:
        target = self.plan.target
        self._skip("stop current layout", f"the {target} layout is already active")
        if self._step("smoke test", lambda: self._smoke(target)).result == "failed":
            return self._finish(Outcome.REFUSED)
        self._boot_step()
        return self._finish(Outcome.UNCHANGED)

    def _roll_back(self, started_any: bool) -> Report:
        plan, previous = self.plan, self.report.previously_running
        ok = True
        # Stop every unit of the target layout: a worker in a restart loop would come back otherwise.
        if started_any:
            ok &= self._step("rollback: stop target layout", lambda: self._stop(plan.units(plan.target))).result == "ok"
        if not previous:
            self._skip("rollback: start previous layout", "nothing was running before the cutover")
            return self._finish(Outcome.ROLLED_BACK if ok else Outcome.ROLLBACK_FAILED)
        layout = self.report.previous
        workers = [u for u in previous if u in plan.workers["pd"] + plan.workers["single"]]
        fronts = [u for u in previous if u in plan.fronts["pd"] + plan.fronts["single"]]
        if workers:
            ok &= self._step("rollback: start previous workers",
                             lambda: self._start(workers, plan.worker_deadline)).result == "ok"
        if ok and fronts:
            ok &= self._step("rollback: start previous router",
                             lambda: self._start(fronts, plan.front_deadline)).result == "ok"
        if ok and layout in LAYOUTS and set(previous) == set(plan.units(layout)):
            ok &= self._step("rollback: smoke test", lambda: self._smoke(layout)).result == "ok"
        return self._finish(Outcome.ROLLED_BACK if ok else Outcome.ROLLBACK_FAILED)
