"""A bench run on this host: on whatever serves now, or --compare across layouts through the cutover.
The edges meet here (the smoke chat, the cutover, the client); what they return is put into the report
by the pure tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pdserve.bench import measure, table
from pdserve.bench.layouts import Compared, Switched, compare
from pdserve.bench.sweep import Sweep
from pdserve.bench.workload import Workload
from pdserve.schema.boot import Layout
from pdserve.schema.config import Deployment
from pdserve.schema.placement import role_url

if TYPE_CHECKING:
    from pdserve.cutover.machine import Cutover


@dataclass
class Report:
    lines: list[str]
    data: dict[str, Any]


@dataclass
class Outcome:
    deployment: str
    workload: Workload
    sweeps: list[Sweep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: Compared | None = None
    refused: bool = False  # the endpoint failed its smoke chat: nothing was measured

    @property
    def complete(self) -> bool:
        done = self.compared.complete if self.compared else all(s.complete for s in self.sweeps)
        return done and not self.refused and bool(self.sweeps)

    @property
    def restored(self) -> bool:
        return self.compared.restored if self.compared else True

    def report(self, at: str, last: Mapping[str, Any] | None, history: Path | None, plot: Path | None) -> Report:
        w = self.workload
        slos = ", ".join(f"{k} {v:g} ms" for k, v in w.slos_ms().items())
        lines = [(f"pdserve bench {self.deployment}: workload {w.name} ({w.input_len} input + {w.output_len} "
                  f"output tokens, seed {w.seed}, SLOs {slos}), {at}")]
        for sweep in self.sweeps:
            lines += table.sweep_lines(sweep)
        if len(self.sweeps) > 1:
            lines.append("side by side (better: the layout ahead by more than 1%):")
            lines += table.compare_lines(self.sweeps)
        change: list[str] = []
        if last is not None and isinstance(last.get("sweeps"), dict):
            change = table.change_lines({s.layout: s for s in self.sweeps}, last["sweeps"], str(last.get("at")))
        elif history is not None:
            change = [f"no earlier run of workload {w.name} in {history}: this one is the baseline"]
        lines += change
        notes = [*(self.compared.notes if self.compared else []), *self.notes]
        lines += [f"note: {note}" for note in notes]
        if history is not None:
            lines.append(f"appended to {history}")
        if plot is not None:
            lines.append(f"plot: {plot}")
        data = {"deployment": self.deployment, "at": at, "workload": w.as_dict(),
                "sweeps": [s.as_dict() for s in self.sweeps], "notes": notes, "complete": self.complete,
                "restored": self.restored, "change": change, "history": str(history) if history else None,
                "plot": str(plot) if plot else None}
        if self.compared:
            data["compare"] = {"start": self.compared.start, "failed_layout": self.compared.failed_layout,
                               "interrupted": self.compared.interrupted, "points": table.comparison(self.sweeps)}
        return Report(lines, data)


class Runner:
    def __init__(self, dep: Deployment, workload: Workload, python: str, api_key: str | None, limit_s: float,
                 say: Callable[[str], None]):
        self.dep, self.workload, self.python, self.api_key = dep, workload, python, api_key
        self.limit_s, self.say = limit_s, say

    def target(self, url: str, layout: str) -> measure.Target:
        model = self.dep.model
        prefills = (role_url(self.dep, "prefill"),) if layout in ("pd", "serving") else ()
        return measure.Target(url, model.served_name or model.path, model.path, self.api_key, prefills)

    def _sweep(self, layout: str, url: str) -> Sweep:
        return measure.sweep(layout, self.python, self.workload, self.target(url, layout), self.limit_s, self.say)

    def _smoke(self, url: str) -> str | None:
        from pdserve.cutover.host import smoke_chat

        check = smoke_chat(self.dep, url)
        return None if check.ok else check.detail

    def serving(self) -> Outcome:
        """The workload on whatever serves at the router's address now."""
        done = Outcome(self.dep.name, self.workload)
        url = role_url(self.dep, "router")
        problem = self._smoke(url)
        if problem:
            done.refused = True
            done.notes.append(f"nothing measured: the endpoint failed its smoke chat: {problem}")
            return done
        done.sweeps.append(self._sweep("serving", url))
        return done

    def compare(self, layouts: Sequence[Layout], machine: Callable[[Layout, bool], Cutover]) -> Outcome:
        """Each layout through the cutover; `machine(layout, probe_port)` makes the cutover to `layout`
        (the command builds it on this host's systemctl; probe_port: time the public port's refusals)."""
        from pdserve.cutover.plan import plan_for
        from pdserve.cutover.report import Outcome as CutoverOutcome

        done = Outcome(self.dep.name, self.workload)
        found = machine("pd", False).dry_run().previous
        if found not in layouts:
            done.refused = True
            done.notes.append(f"--compare needs one layout serving at the start, to come back to; found "
                              f"{found or 'state unknown'}: start one with `pdserve cutover pd` (or single)")
            return done
        start = cast(Layout, found)
        problem = self._smoke(plan_for(self.dep, start).public_url[start])
        if problem:
            done.refused = True
            done.notes.append(f"nothing measured: {start}, serving now, failed its smoke chat: {problem}")
            return done

        def switch(layout: Layout) -> Switched:
            self.say(f"cutover to {layout} ...")
            report = machine(layout, True).run()
            ok = report.outcome in (CutoverOutcome.SUCCESS, CutoverOutcome.UNCHANGED)
            failed = [s for s in report.steps if s.result == "failed"]
            detail = f"{report.outcome}" + (f" at {failed[0].name}: {failed[0].detail}" if failed else "")
            serving = layout if ok else (report.previous if report.outcome != CutoverOutcome.ROLLBACK_FAILED
                                         and report.previous in ("pd", "single") else None)
            self.say(f"cutover to {layout}: {detail}")
            return Switched(layout, ok, serving, detail)  # type: ignore[arg-type]

        def sweep(layout: Layout) -> Sweep:
            return self._sweep(layout, plan_for(self.dep, layout).public_url[layout])

        done.compared = compare(layouts, start, switch, sweep)
        done.sweeps = done.compared.sweeps
        return done
