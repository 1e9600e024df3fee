"""The figures of one sweep point, read from the client's result record. Pure.

sglang.bench_serving appends one JSON object per run to its --output-file. It is read here through the
project's strict JSON parser (pdserve.probes.http.parse_json: no NaN or Infinity, no 4000-digit integers,
bounded nesting) and then field by field: each figure must be a finite, non-negative number below a bound
no real run reaches, so a broken client or a hand-edited file cannot put nonsense into a table or history.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from pdserve.bench.workload import Point
from pdserve.probes.http import NotJson, parse_json

# A figure above this is no measurement (1e12 ms is 30 years; 1e12 tokens/s is no server).
MAX_FIGURE = 1e12
CAUSE_CHARS = 160


@dataclass(frozen=True)
class Figure:
    key: str  # as pdserve writes it (JSON, history)
    source: str  # the client's key
    label: str
    better: Literal["lower", "higher"]


FIGURES: tuple[Figure, ...] = (
    Figure("ttft_p50_ms", "median_ttft_ms", "TTFT p50 (ms)", "lower"),
    Figure("ttft_p90_ms", "p90_ttft_ms", "TTFT p90 (ms)", "lower"),
    Figure("ttft_p99_ms", "p99_ttft_ms", "TTFT p99 (ms)", "lower"),
    Figure("itl_p50_ms", "median_itl_ms", "ITL p50 (ms)", "lower"),
    Figure("itl_p90_ms", "p90_itl_ms", "ITL p90 (ms)", "lower"),
    Figure("itl_p99_ms", "p99_itl_ms", "ITL p99 (ms)", "lower"),
    Figure("e2e_p50_ms", "median_e2e_latency_ms", "E2E p50 (ms)", "lower"),
    Figure("e2e_p90_ms", "p90_e2e_latency_ms", "E2E p90 (ms)", "lower"),
    Figure("e2e_p99_ms", "p99_e2e_latency_ms", "E2E p99 (ms)", "lower"),
    Figure("output_tok_s", "output_throughput", "output tok/s", "higher"),
    Figure("total_tok_s", "total_throughput", "total tok/s", "higher"),
    Figure("request_s", "request_throughput", "requests/s", "higher"),
    Figure("goodput_req_s", "request_goodput", "goodput req/s", "higher"),
    Figure("slo_attainment", "slo_attainment", "SLO attainment", "higher"),
)
# Figures pdserve adds to the client's: failed requests, and the KV hand-off from the servers' metrics.
ERRORS = Figure("errors", "", "errors", "lower")
KV_TRANSFER = Figure("kv_transfer_ms", "", "KV transfer mean (ms)", "lower")
ALL_FIGURES: tuple[Figure, ...] = (*FIGURES, ERRORS, KV_TRANSFER)
# The figures the client writes only when asked with --goodput, an option SGLang's client gained after 0.5.17:
# a client run without it writes neither key, and the point is measured without them.
GOODPUT_KEYS = frozenset({"goodput_req_s", "slo_attainment"})
BY_KEY = {f.key: f for f in ALL_FIGURES}
COUNTS = ("completed", "total_input_tokens", "total_output_tokens")


@dataclass(frozen=True)
class PointResult:
    point: Point
    figures: dict[str, float] = field(default_factory=dict)
    completed: int = 0
    duration_s: float = 0.0
    total_output_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # the client's error text (cut) -> how many
    failure: str | None = None  # why this point has no figures: the client failed, timed out, was interrupted

    @property
    def measured(self) -> bool:
        return self.failure is None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.point.kind, "value": self.point.value, "prompts": self.point.prompts,
                "completed": self.completed, "duration_s": self.duration_s,
                "total_output_tokens": self.total_output_tokens, "figures": dict(self.figures),
                "errors": dict(self.errors), "failure": self.failure}


def failed(point: Point, why: str) -> PointResult:
    return PointResult(point, failure=why)


def _figure(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} = {str(value)[:40]!r} is not a number")
    if not 0 <= value <= MAX_FIGURE:  # NaN fails this too
        raise ValueError(f"{key} = {value!r} is out of range (0 to {MAX_FIGURE:g})")
    return float(value)


def cause(text: str) -> str:
    """An error as one short line: a traceback's last line, a server's answer's start."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "(empty)"
    return line if len(line) <= CAUSE_CHARS else line[:CAUSE_CHARS] + "..."


def read_record(point: Point, data: bytes, kv_transfer_ms: float | None = None,
                goodput: bool = True) -> PointResult:
    """The point's figures from the client's --output-file (its last record: the file is appended to).
    `goodput`: whether the client was run with --goodput; without it the goodput figures are not read (and
    not required), with it a record that lacks them is unreadable like any other missing figure."""
    lines = [line for line in data.splitlines() if line.strip()]
    if not lines:
        return failed(point, "the client wrote no result (every request may have failed before it could)")
    try:
        record = parse_json(lines[-1])
    except NotJson as exc:
        return failed(point, f"the client's result is unreadable: {exc}")
    if not isinstance(record, dict):
        return failed(point, "the client's result is not a JSON object")
    try:
        figures = {f.key: _figure(record, f.source) for f in FIGURES if goodput or f.key not in GOODPUT_KEYS}
        counts = {key: int(_figure(record, key)) for key in COUNTS}
        duration = _figure(record, "duration")
    except ValueError as exc:
        return failed(point, f"the client's result is unreadable: {exc}")
    errors = Counter(cause(e) for e in _errors(record) if e)
    figures[ERRORS.key] = float(max(point.prompts - counts["completed"], sum(errors.values())))
    if kv_transfer_ms is not None:
        figures[KV_TRANSFER.key] = kv_transfer_ms
    return PointResult(point, figures, counts["completed"], duration, counts["total_output_tokens"], dict(errors))


def _errors(record: dict[str, Any]) -> list[str]:
    errors = record.get("errors")
    if not isinstance(errors, list):
        return []
    return [e for e in errors if isinstance(e, str)]


def inconsistencies(result: PointResult) -> list[str]:
    """Where the client's figures disagree with each other: the percentiles out of order, more requests
    done than sent, a throughput that is not its tokens over the run's duration."""
    if not result.measured:
        return []
    f, found = result.figures, []
    for family in ("ttft", "itl", "e2e"):
        p50, p90, p99 = (f.get(f"{family}_p{q}_ms", math.nan) for q in (50, 90, 99))
        if all(map(math.isfinite, (p50, p90, p99))) and not p50 <= p90 <= p99:
            found.append(f"{family} percentiles out of order: p50 {p50:g}, p90 {p90:g}, p99 {p99:g}")
    if result.completed > result.point.prompts:
        found.append(f"{result.completed} requests done of {result.point.prompts} sent")
    if result.duration_s > 0 and result.total_output_tokens and "output_tok_s" in f:
        expected = result.total_output_tokens / result.duration_s
        if abs(f["output_tok_s"] - expected) > 0.01 * expected:
            found.append(f"output tok/s {f['output_tok_s']:g} is not {result.total_output_tokens} tokens / "
                         f"{result.duration_s:g} s")
    if "goodput_req_s" in f and "request_s" in f and f["goodput_req_s"] > f["request_s"] * 1.0001 + 1e-9:
        found.append(f"goodput {f['goodput_req_s']:g} req/s above the request rate served {f['request_s']:g}")
    return found
