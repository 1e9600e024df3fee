"""The tables people read: one sweep (figures down, sweep points across), two layouts side by side with
the winner of each figure, and a run's change against the last one in the history. Pure: lines of text,
as the cutover's report is, so a terminal, a journal and a CI log show the same thing."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pdserve.bench.figures import ALL_FIGURES, BY_KEY, Figure, PointResult, inconsistencies
from pdserve.bench.sweep import Sweep

LABEL = 22  # the widest figure label, "KV transfer mean (ms)", and a space
CELL = 12
CHANGE_CELL = 16  # "+100.0% better" and a gap
TIE = 0.01  # two figures within 1% of each other are a tie: run-to-run noise is larger than that


def shown(value: float | None, key: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if key == "slo_attainment":
        return f"{value * 100:.1f}%"
    if key == "errors":
        return f"{value:.0f}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _row(label: str, cells: Sequence[str], width: int = CELL) -> str:
    return f"  {label:<{LABEL}}" + "".join(f"{c:>{width}}" for c in cells)


def _figures(results: Sequence[PointResult]) -> list[Figure]:
    """The figures any point has (the KV transfer time only where the servers expose it)."""
    return [f for f in ALL_FIGURES if any(f.key in r.figures for r in results)]


def sweep_lines(sweep: Sweep) -> list[str]:
    lines = [f"{sweep.layout} at {sweep.url}"]
    results = sweep.results
    lines.append(_row("load", [r.point.label for r in results]))
    lines.append(_row("requests done/sent", [f"{r.completed}/{r.point.prompts}" for r in results]))
    for figure in _figures(results):
        lines.append(_row(figure.label, [shown(r.figures.get(figure.key), figure.key) for r in results]))
    for r in results:
        if r.failure:
            lines.append(f"  {r.point.label}: no figures: {r.failure}")
        for text, count in sorted(r.errors.items(), key=lambda item: -item[1])[:5]:
            lines.append(f"  {r.point.label}: {count} failed: {text}")
        for text in inconsistencies(r):
            lines.append(f"  {r.point.label}: the client's figures disagree: {text}")
    lines += [f"  note: {note}" for note in sweep.notes]
    if sweep.interrupted:
        lines.append("  interrupted: the figures above are what was measured before it")
    return lines


def winner(figure: Figure, values: Mapping[str, float | None]) -> str:
    """The layout whose value is better, "tie" within TIE, "-" when a side has no value."""
    known = {layout: v for layout, v in values.items() if v is not None and math.isfinite(v)}
    if len(known) < 2 or len(known) != len(values):
        return "-"
    ranked = sorted(known.items(), key=lambda item: item[1], reverse=figure.better == "higher")
    (best, b), (_, second) = ranked[0], ranked[1]
    if abs(b - second) <= TIE * max(abs(b), abs(second)):
        return "tie"
    return best


def comparison(sweeps: Sequence[Sweep]) -> list[dict]:
    """Each sweep point: every layout's value of each figure and the better layout (what --json carries)."""
    points = []
    for index in range(max((len(s.results) for s in sweeps), default=0)):
        results = {s.layout: s.results[index] if index < len(s.results) else None for s in sweeps}
        point = next(r.point for r in results.values() if r is not None)
        figures = {}
        for figure in _figures([r for r in results.values() if r is not None]):
            values = {layout: (r.figures.get(figure.key) if r is not None else None) for layout, r in results.items()}
            figures[figure.key] = {**values, "better": winner(figure, values)}
        points.append({"load": point.label, "prompts": point.prompts, "figures": figures})
    return points


def compare_lines(sweeps: Sequence[Sweep]) -> list[str]:
    """Each sweep point with every layout's figure side by side and the better one named."""
    layouts = [s.layout for s in sweeps]
    lines = []
    for point in comparison(sweeps):
        lines.append(f"{point['load']} ({point['prompts']} prompts)")
        lines.append(_row("figure", [*layouts, "better"]))
        for key, values in point["figures"].items():
            lines.append(_row(BY_KEY[key].label, [*(shown(values[layout], key) for layout in layouts),
                                                  values["better"]]))
    return lines


def change(figure_key: str, before: float | None, now: float | None) -> str:
    if before is None or now is None or not (math.isfinite(before) and math.isfinite(now)):
        return "-"
    if before == 0:
        return "=" if now == 0 else "new"
    percent = (now - before) / abs(before) * 100
    better = BY_KEY[figure_key].better
    verdict = "" if abs(percent) < TIE * 100 else (" better" if (percent < 0) == (better == "lower") else " worse")
    return f"{percent:+.1f}%{verdict}"


def change_lines(now: Mapping[str, Sweep], last: Mapping[str, dict], last_at: str) -> list[str]:
    """Each layout's figures against the last run of the same workload in the history (`last`: its
    sweeps as written, by layout)."""
    lines = [f"change against the run of {last_at}:"]
    for layout, sweep in now.items():
        before = last.get(layout)
        if before is None:
            lines.append(f"  {layout}: not in the last run")
            continue
        old_points = {(p.get("kind"), p.get("value")): p for p in before.get("points", []) if isinstance(p, dict)}
        for result in sweep.results:
            old = old_points.get((result.point.kind, result.point.value))
            if old is None or not isinstance(old.get("figures"), dict):
                lines.append(f"  {layout} {result.point.label}: not in the last run")
                continue
            lines.append(_row(f"{layout} {result.point.label}", ["last", "now", "change"], CHANGE_CELL))
            for figure in _figures([result]):
                was = old["figures"].get(figure.key)
                was = float(was) if isinstance(was, int | float) and not isinstance(was, bool) else None
                now_value = result.figures[figure.key]
                lines.append(_row(f"  {figure.label}", [shown(was, figure.key), shown(now_value, figure.key),
                                                        change(figure.key, was, now_value)], CHANGE_CELL))
    return lines
