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
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from pdserve.cutover.boot_links import BootReport, UnitFiles, boot_access, boot_report, layout_at_boot
from pdserve.probes.systemctl import SystemctlError, UnitState, service
from pdserve.schema.boot import file_line, nixos_line
from pdserve.schema.config import Deployment
from pdserve.schema.derived import ROUTER_START_TIMEOUT_SEC, role_url, unit_name

Layout = Literal["pd", "single"]
LAYOUTS: tuple[Layout, ...] = ("pd", "single")

# Our own deadlines sit above systemd's, so systemd's verdict (with its Result) normally arrives first.
DEADLINE_MARGIN_SEC = 15
POLL_INTERVAL_SEC = 0.5

EXIT_SUCCESS, EXIT_FAILED, EXIT_USAGE, EXIT_ROLLBACK_FAILED = 0, 1, 2, 3


class Outcome(StrEnum):
    SUCCESS = "success"
    UNCHANGED = "already-serving"
    REFUSED = "refused-by-preflight"
    ROLLED_BACK = "failed-rolled-back"
    ROLLBACK_FAILED = "rollback-failed"
    DRY_RUN = "dry-run"


EXIT_CODES = {
    Outcome.SUCCESS: EXIT_SUCCESS,
    Outcome.UNCHANGED: EXIT_SUCCESS,
    Outcome.DRY_RUN: EXIT_SUCCESS,
    Outcome.REFUSED: EXIT_FAILED,
    Outcome.ROLLED_BACK: EXIT_FAILED,
    Outcome.ROLLBACK_FAILED: EXIT_ROLLBACK_FAILED,
}


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    unit: str | None  # the systemd unit whose cgroup holds the process; None when it is in none


class GpuUnknown(Exception):
    """The GPU holders cannot be read here (no NVML, no driver); the check is skipped with this reason."""


class Edge(Protocol):
    def show(self, units: Sequence[str]) -> dict[str, UnitState]: ...
    def start(self, units: Sequence[str]) -> None: ...
    def stop(self, units: Sequence[str], timeout: float) -> None: ...
    def add_wants(self, target: str, units: Sequence[str]) -> None: ...
    def disable(self, units: Sequence[str]) -> None: ...
    def reset_failed(self, units: Sequence[str]) -> None: ...
    def unit_files(self, states: dict[str, UnitState]) -> UnitFiles: ...
    def smoke(self, layout: Layout) -> Check: ...
    def gpu_processes(self, gpus: Sequence[int]) -> list[GpuProcess]: ...
    def clock(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class Measurement(Protocol):
    """The refused-connection prober, seen from the cutover: started before the first change."""

    def start(self) -> object: ...
    def stop(self) -> object: ...


@dataclass(frozen=True)
class Plan:
    """What a cutover to `target` touches, read off the deployment. Unit names end in .service."""

    deployment: str
    target: Layout
    workers: dict[Layout, tuple[str, ...]]  # started first, in one call (workers_in_turn: systemd orders them)
    fronts: dict[Layout, tuple[str, ...]]  # started once the workers are ready (the router)
    gpus: dict[Layout, tuple[int, ...]]
    public_url: dict[Layout, str]
    worker_deadline: float
    front_deadline: float
    stop_deadline: float
    warnings: tuple[str, ...] = ()
    declared: Layout = "pd"  # the deployment's boot_layout
    wanted_by: str = "multi-user.target"
    source: str = "the deployment file"  # where the deployment was loaded from
    nixos_change: str = ""  # the NixOS option line that declares `target` as the boot layout
    workers_in_turn: bool = False  # prefill and decode share GPUs: the decode unit is After= the prefill

    def units(self, layout: Layout) -> tuple[str, ...]:
        return self.workers[layout] + self.fronts[layout]

    @property
    def all_units(self) -> tuple[str, ...]:
        return self.units("pd") + self.units("single")

    @property
    def other(self) -> Layout:
        return "single" if self.target == "pd" else "pd"


def plan_for(dep: Deployment, target: Layout, warnings: Sequence[str] = (), source: str = "the deployment file") -> Plan:
    def svc(role: str) -> str:
        return service(unit_name(dep, role))  # type: ignore[arg-type]

    # On shared GPUs (allow_shared_gpus) the rendered decode unit is ordered After= the prefill
    # (pdserve.render.units), so the decode is ready up to two start timeouts after both were started.
    in_turn = bool(set(dep.prefill.gpus) & set(dep.decode.gpus))
    return Plan(
        deployment=dep.name,
        target=target,
        workers={"pd": (svc("prefill"), svc("decode")), "single": (svc("fallback"),)},
        fronts={"pd": (svc("router"),), "single": ()},
        gpus={"pd": tuple(sorted({*dep.prefill.gpus, *dep.decode.gpus})), "single": tuple(sorted(dep.fallback.gpus))},
        public_url={"pd": role_url(dep, "router"), "single": role_url(dep, "fallback")},
        worker_deadline=(2 if in_turn else 1) * dep.systemd.start_timeout_sec + DEADLINE_MARGIN_SEC,
        front_deadline=ROUTER_START_TIMEOUT_SEC + DEADLINE_MARGIN_SEC,
        stop_deadline=dep.systemd.stop_timeout_sec + DEADLINE_MARGIN_SEC,
        warnings=tuple(warnings),
        declared=dep.boot_layout,
        wanted_by=dep.systemd.wanted_by,
        source=source,
        nixos_change=nixos_line(dep, target),
        workers_in_turn=in_turn,
    )


@dataclass
class Step:
    name: str
    started_s: float
    duration_s: float = 0.0
    result: Literal["ok", "failed", "skipped", "planned"] = "ok"
    detail: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "started_s": round(self.started_s, 2), "duration_s": round(self.duration_s, 2),
                "result": self.result, "detail": self.detail}


@dataclass
class Report:
    deployment: str
    target: Layout
    previous: str = "unknown"  # pd, single, none, or pd+single
    previously_running: list[str] = field(default_factory=list)
    outcome: Outcome = Outcome.SUCCESS
    steps: list[Step] = field(default_factory=list)
    refusals: list[object] = field(default_factory=list)
    boot: BootReport | None = None  # None: the cutover did not reach the boot step
    total_s: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def as_dict(self) -> dict:
        return {
            "deployment": self.deployment,
            "target": self.target,
            "previous": self.previous,
            "previously_running": self.previously_running,
            "outcome": str(self.outcome),
            "exit_code": self.exit_code,
            "total_seconds": round(self.total_s, 2),
            "steps": [s.as_dict() for s in self.steps],
            "refused": [r.as_dict() if hasattr(r, "as_dict") else r for r in self.refusals],
            "boot": self.boot.as_dict() if self.boot else None,
        }


def layout_of(running: Sequence[str], plan: Plan) -> str:
    layouts = [lay for lay in LAYOUTS if any(u in running for u in plan.units(lay))]
    return "+".join(layouts) if layouts else "none"


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

    def steps_preview(self, running: Sequence[str], serving: Sequence[str] = ()) -> list[Step]:
        plan, t = self.plan, self.plan.target
        stop = [u for u in plan.all_units if u in running]
        restore = [u for u in plan.all_units if u in serving]
        workers = plan.workers[t]
        if t == "pd" and plan.workers_in_turn:
            how = f"prefill, then decode (they share GPUs): {workers[0]} then {workers[1]}"
        else:
            how = f"{', '.join(workers)} in parallel"
        names = [
            ("preflight: units installed", ", ".join(plan.all_units)),
            ("preflight: target GPUs free", f"GPUs {list(plan.gpus[t])} free or held by {', '.join(stop) or 'nothing'}"),
            ("stop current layout", ", ".join(stop) or "nothing running"),
            (f"start {'workers' if t == 'pd' else 'fallback'}",
             f"{how}, until active (<= {plan.worker_deadline:g} s)"),
        ]
        if plan.fronts[t]:
            names.append(("start router", f"{', '.join(plan.fronts[t])} (<= {plan.front_deadline:g} s)"))
        names += [
            ("smoke test", (f"pdserve verify --only router.readiness,router.workers,e2e.chat through {plan.public_url[t]}"
                            if t == "pd" else f"chat completion through {plan.public_url[t]}")),
            ("enable at boot", f"link {', '.join(plan.units(t))} into {plan.wanted_by}; disable "
                               f"{', '.join(plan.units(plan.other))}; where the unit directory is read-only (NixOS) "
                               f"leave it and name the boot_layout line (declared now: {plan.declared})"),
            ("on failure: roll back", f"stop {', '.join(plan.units(t))}; start {', '.join(restore) or 'nothing'}; smoke test"),
        ]
        return [Step(n, 0.0, 0.0, "planned", d) for n, d in names]

    def dry_run(self) -> Report:
        try:
            states = self.edge.show(self.plan.all_units)
            running = [n for n, s in states.items() if s.running]
            serving = [n for n, s in states.items() if s.active_state == "active"]
            self.report.previous = layout_of(serving, self.plan)
            self.report.previously_running = serving
        except SystemctlError as exc:
            running = serving = []
            self.report.previous = f"unknown ({exc})"
        self.report.steps = self.steps_preview(running, serving)
        return self._finish(Outcome.DRY_RUN)

    def run(self) -> Report:
        plan, edge, target = self.plan, self.edge, self.plan.target
        states: dict[str, UnitState] = {}

        def observe() -> str:
            states.update(edge.show(plan.all_units))
            return "; ".join(s.describe() for s in states.values())

        if self._step("observe units", observe).result == "failed":
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
        if plan.fronts[target]:
            if self._step("start router", lambda: self._start(plan.fronts[target], plan.front_deadline)).result == "failed":
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
        result, detail, nixos = self._try_relink()
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
        step.result = {"changed": "ok", "unchanged": "ok", "read-only": "skipped"}.get(result, "failed")
        step.detail = boot.summary()
        step.duration_s = self.edge.clock() - began

    def _try_relink(self) -> tuple[str, str, bool]:
        """(result, detail, nixos): whether and how the boot links changed. Never raises."""
        plan = self.plan
        nixos = False
        try:
            states = self.edge.show(plan.all_units)
            access = boot_access(states, self.edge.unit_files(states))
            nixos = access.nixos
            if not access.settable:
                return "read-only", f"boot links left as they are: {access.reason}", nixos
            return (*self._relink(states), nixos)
        except OSError as exc:  # reading the unit files' facts
            return "failed", f"could not read the unit files: {exc}", nixos
        except SystemctlError as exc:
            if exc.read_only:
                return "read-only", f"boot links left as they are: {exc}", nixos
            return "failed", f"could not change the boot links: {exc}", nixos
        except KeyboardInterrupt as exc:
            return "failed", f"interrupted ({exc.args[0] if exc.args else 'Ctrl-C'}) while changing the boot links", nixos

    def _relink(self, states: dict[str, UnitState]) -> tuple[str, str]:
        """Link the target into the boot target first, then unlink the other layout: a failure half way
        leaves something that starts at boot rather than nothing."""
        plan = self.plan
        link = [u for u in plan.units(plan.target) if not states[u].enabled]
        unlink = [u for u in plan.units(plan.other) if states[u].enabled]
        if link:
            self.edge.add_wants(plan.wanted_by, link)
        if unlink:
            self.edge.disable(unlink)
        if not link and not unlink:
            return "unchanged", f"{plan.target} already starts at boot and {plan.other} does not"
        done = [f"linked {', '.join(link)} into {plan.wanted_by}"] if link else []
        done += [f"disabled {', '.join(unlink)}"] if unlink else []
        return "changed", "; ".join(done)

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
        if ok and layout in LAYOUTS and set(previous) == set(plan.units(layout)):  # type: ignore[arg-type]
            ok &= self._step("rollback: smoke test", lambda: self._smoke(layout)).result == "ok"  # type: ignore[arg-type]
        return self._finish(Outcome.ROLLED_BACK if ok else Outcome.ROLLBACK_FAILED)
