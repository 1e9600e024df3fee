"""The comparison's output, pure: per fault and router the measured figures (a JSON-ready dict), one table
per tier with the routers side by side (a column each), and the JSON record of the whole run."""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

SCHEMA_VERSION = 1
WIDTH = 120

Figures = dict[str, Any]


class Outcome(Protocol):  # tests/fixtures/loadgen.py's Outcome, as far as it is read here
    cause: str
    retry_after: str | None

    @property
    def ok(self) -> bool: ...

    @property
    def seconds(self) -> float: ...


def failure_figures(outcomes: Iterable[Outcome]) -> Figures:
    """What every row tells of the failures: how many, by cause, how many were a 503 with Retry-After (the
    retryable refusal), and how long the slowest failed request waited for its answer."""
    failures = [o for o in outcomes if not o.ok]
    return {
        "failed": len(failures),
        "causes": dict(Counter(o.cause for o in failures).most_common()),
        "retry_after_503": sum(1 for o in failures if o.cause == "HTTP 503" and o.retry_after is not None),
        "slowest_failure_s": round(max(o.seconds for o in failures), 3) if failures else None,
    }


@dataclass(frozen=True)
class Measure:
    label: str
    show: Callable[[Figures], str]


def _seconds(key: str, none: str = "-") -> Callable[[Figures], str]:
    return lambda f: none if f.get(key) is None else f"{f[key]:.2f} s"


def _failed(f: Figures) -> str:
    causes = ", ".join(f"{n} {cause}" for cause, n in f["causes"].items())
    return f"{f['failed']} ({causes})" if f["failed"] else "0"


def _success_again(f: Figures) -> str:
    if not f["failed"]:
        return "no failure"
    return "never" if f.get("recovered_s") is None else f"{f['recovered_s']:.2f} s"


def _success_after_ready(f: Figures) -> str:
    if not f["failed"]:
        return "no failure"
    if f.get("recovered_s") is None or f.get("ready_again_s") is None:
        return "-"
    return f"{f['recovered_s'] - f['ready_again_s']:+.2f} s"


CONTAINER_MEASURES = (
    Measure("sent", lambda f: str(f["sent"])),
    Measure("failed (by cause)", _failed),
    Measure("503 with Retry-After", lambda f: str(f["retry_after_503"])),
    Measure("slowest failed request", _seconds("slowest_failure_s")),
    Measure("longest refused window (port)", _seconds("longest_refused_s", "0 s")),
    Measure("success again after the fault", _success_again),
    Measure("success again after role ready", _success_after_ready),
    Measure("role ready again after the fault", _seconds("ready_again_s", "not restarted")),
)

HOST_MEASURES = (
    Measure("sent", lambda f: str(f["sent"])),
    Measure("failed (by cause)", _failed),
    Measure("failed after the router's mark", lambda f: str(f["after_mark_failed"])),
    Measure("503 with Retry-After", lambda f: str(f["retry_after_503"])),
    Measure("slowest failed request", _seconds("slowest_failure_s")),
    Measure("marked unhealthy after the fault", _seconds("marked_s")),
    Measure("taken back after the host's return", _seconds("taken_back_s")),
    Measure("serving again after the host's return", _seconds("serving_again_s")),
)

MEASURES = {"container": CONTAINER_MEASURES, "multihost": HOST_MEASURES}


@dataclass(frozen=True)
class FaultResult:
    name: str
    by_router: dict[str, Figures]  # router key -> figures, or {"error": text} when the run failed


@dataclass
class TierResult:
    name: str  # a key of MEASURES
    title: str
    settings: list[str]  # lines under the title: load, timeouts, what the columns mean
    routers: dict[str, str]  # router key -> column title, in column order
    faults: list[FaultResult] = field(default_factory=list)
    # Texts the run used, kept in the record: the rendered router unit, the 0.3.2 drop-in.
    artifacts: dict[str, str] = field(default_factory=dict)


def _cell(measure: Measure, figures: Figures | None) -> str:
    if figures is None:
        return "not run"
    if "error" in figures:
        return "error (see notes)"
    return measure.show(figures)


def side_by_side(tier: TierResult) -> str:
    """The tier's table: per fault one line per measure, one column per router; then each run's note."""
    measures = MEASURES[tier.name]
    head = ["fault", "measure", *tier.routers.values()]
    rows: list[list[str]] = []
    for fault in tier.faults:
        for i, measure in enumerate(measures):
            rows.append([fault.name if i == 0 else "", measure.label,
                         *(_cell(measure, fault.by_router.get(key)) for key in tier.routers)])
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    out = [tier.title, *tier.settings, "", line(head), line(["-" * w for w in widths])]
    for index, row in enumerate(rows):
        if index and row[0]:
            out.append("")
        out.append(line(row))
    notes = [(fault.name, tier.routers[key], figures.get("error") or figures.get("note"))
             for fault in tier.faults for key, figures in fault.by_router.items() if key in tier.routers]
    if any(text for _, _, text in notes):
        out += ["", "notes:"]
        for fault_name, router, text in notes:
            if text:
                out += textwrap.wrap(f"{fault_name}, {router}: {text}", width=WIDTH, initial_indent="  ",
                                     subsequent_indent="    ")
    return "\n".join(out) + "\n"


def record(meta: Mapping[str, Any], tiers: Iterable[TierResult]) -> dict[str, Any]:
    """The JSON record: the run's facts (date, hardware, command, commit, versions) and every figure."""
    return {
        "schema_version": SCHEMA_VERSION,
        **meta,
        "tiers": {tier.name: {"title": tier.title, "settings": tier.settings, "routers": tier.routers,
                              "faults": [{"fault": f.name, "by_router": f.by_router} for f in tier.faults],
                              "artifacts": tier.artifacts}
                  for tier in tiers},
    }
