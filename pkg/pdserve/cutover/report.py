"""What a cutover reports: its outcome and exit code, the timeline of steps, the layout it found.

The exit codes are the numbers of pdserve.cli.exits.Exit (this layer sits below the command line and
cannot import it; tests/unit/test_cutover_dry_run.py holds the two tables equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pdserve.cutover.boot_links import BootReport
from pdserve.cutover.refusals import RefusalSummary
from pdserve.schema.boot import Layout

EXIT_SUCCESS, EXIT_FAILED, EXIT_ROLLBACK_FAILED, EXIT_UNKNOWN = 0, 1, 3, 4


class Outcome(StrEnum):
    SUCCESS = "success"
    UNCHANGED = "already-serving"
    REFUSED = "refused-by-preflight"
    ROLLED_BACK = "failed-rolled-back"
    ROLLBACK_FAILED = "rollback-failed"
    DRY_RUN = "dry-run"
    # A dry run that could not read which units run: its steps say "state unknown", not "nothing running".
    DRY_RUN_UNKNOWN = "dry-run-state-unknown"


EXIT_CODES = {
    Outcome.SUCCESS: EXIT_SUCCESS,
    Outcome.UNCHANGED: EXIT_SUCCESS,
    Outcome.DRY_RUN: EXIT_SUCCESS,
    Outcome.DRY_RUN_UNKNOWN: EXIT_UNKNOWN,
    Outcome.REFUSED: EXIT_FAILED,
    Outcome.ROLLED_BACK: EXIT_FAILED,
    Outcome.ROLLBACK_FAILED: EXIT_ROLLBACK_FAILED,
}
DRY_RUNS = (Outcome.DRY_RUN, Outcome.DRY_RUN_UNKNOWN)


StepResult = Literal["ok", "failed", "skipped", "planned"]


@dataclass
class Step:
    name: str
    started_s: float
    duration_s: float = 0.0
    result: StepResult = "ok"
    detail: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "started_s": round(self.started_s, 2), "duration_s": round(self.duration_s, 2),
                "result": self.result, "detail": self.detail}


@dataclass
class Report:
    deployment: str
    target: Layout
    previous: str | None = None  # pd, single, none or pd+single; None: not read (state_unknown says why)
    previously_running: list[str] = field(default_factory=list)
    outcome: Outcome = Outcome.SUCCESS
    steps: list[Step] = field(default_factory=list)
    refusals: list[RefusalSummary] = field(default_factory=list)
    boot: BootReport | None = None  # None: the cutover did not reach the boot step
    total_s: float = 0.0
    state_unknown: str | None = None  # why the units' state could not be read; None once it was

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @property
    def previous_label(self) -> str:
        """The layout found, for people: "state unknown" when it was not read."""
        return self.previous if self.previous is not None else "state unknown"

    def as_dict(self) -> dict:
        return {
            "deployment": self.deployment,
            "target": self.target,
            "previous": self.previous,
            "state_unknown": self.state_unknown,
            "previously_running": self.previously_running,
            "outcome": str(self.outcome),
            "exit_code": self.exit_code,
            "total_seconds": round(self.total_s, 2),
            "steps": [s.as_dict() for s in self.steps],
            # A measurement may answer its summary as a dict already (a test's stand-in prober does).
            "refused": [r.as_dict() if hasattr(r, "as_dict") else r for r in self.refusals],
            "boot": self.boot.as_dict() if self.boot else None,
        }
