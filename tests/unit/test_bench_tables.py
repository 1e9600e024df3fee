"""`pdserve bench`'s tables and history (issue 40): the better layout named per figure (lower latency,
higher throughput, a tie within 1%), the change against the last run of the same workload, and a history
file that survives a run cut short while writing."""

from __future__ import annotations

import json
import os
import stat

from pdserve.bench import history, table
from pdserve.bench.figures import BY_KEY, PointResult
from pdserve.bench.sweep import Sweep
from pdserve.bench.workload import read_workload

WORKLOAD, _ = read_workload("w", {"input_len": 8, "output_len": 4, "request_rates": [1, 2], "prompts": 4})
P1, P2 = WORKLOAD.points()


def result(point, **figures) -> PointResult:
    return PointResult(point, {k: float(v) for k, v in figures.items()}, completed=point.prompts, duration_s=1.0)


def test_the_better_layout_per_figure_follows_the_figures_direction():
    ttft, tok = BY_KEY["ttft_p50_ms"], BY_KEY["output_tok_s"]
    assert table.winner(ttft, {"single": 80.0, "pd": 40.0}) == "pd"
    assert table.winner(tok, {"single": 900.0, "pd": 700.0}) == "single"
    assert table.winner(tok, {"single": 1000.0, "pd": 1005.0}) == "tie"
    assert table.winner(tok, {"single": 1000.0, "pd": None}) == "-"
    assert table.winner(BY_KEY["errors"], {"single": 0.0, "pd": 3.0}) == "single"
    assert table.winner(BY_KEY["errors"], {"single": 0.0, "pd": 0.0}) == "tie"


def test_the_side_by_side_table_has_each_point_each_layout_and_the_winner():
    single = Sweep("single", "http://a", [result(P1, ttft_p50_ms=80, output_tok_s=100), result(P2, ttft_p50_ms=90)])
    pd = Sweep("pd", "http://a", [result(P1, ttft_p50_ms=40, output_tok_s=90, kv_transfer_ms=3)])
    lines = table.compare_lines([single, pd])
    text = "\n".join(lines)
    assert "1 req/s (4 prompts)" in text and "2 req/s (4 prompts)" in text
    row = next(line for line in lines if "TTFT p50" in line)
    assert row.split()[-3:] == ["80.0", "40.0", "pd"]
    kv = next(line for line in lines if "KV transfer" in line)
    assert kv.split()[-3:] == ["-", "3.00", "-"]  # a single server has no hand-off: no winner
    first, second = table.comparison([single, pd])  # what --json carries
    assert first["figures"]["ttft_p50_ms"] == {"single": 80.0, "pd": 40.0, "better": "pd"}
    assert second["figures"]["ttft_p50_ms"] == {"single": 90.0, "pd": None, "better": "-"}


def test_a_sweep_table_names_failures_errors_and_an_interrupt():
    failed = PointResult(P2, failure="the client exited 1: ValueError: Warmup failed")
    sweep = Sweep("pd", "http://a", [PointResult(P1, {"ttft_p50_ms": 5.0, "errors": 1.0}, completed=3,
                                                 errors={"Unauthorized": 1}), failed], interrupted=True)
    text = "\n".join(table.sweep_lines(sweep))
    assert "3/4" in text and "1 failed: Unauthorized" in text and "Warmup failed" in text and "interrupted" in text


def test_change_against_the_last_run_says_better_or_worse_by_direction():
    assert table.change("ttft_p50_ms", 100.0, 80.0) == "-20.0% better"
    assert table.change("output_tok_s", 100.0, 80.0) == "-20.0% worse"
    assert table.change("output_tok_s", 100.0, 100.5) == "+0.5%"
    assert table.change("errors", 0.0, 0.0) == "=" and table.change("errors", 0.0, 2.0) == "new"
    assert table.change("errors", None, 2.0) == "-"


def test_history_appends_finds_the_last_same_workload_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "h.jsonl"
    old = Sweep("pd", "http://a", [result(P1, ttft_p50_ms=100)])
    history.append(path, history.entry("dep", "2026-12-01T00:00:00+00:00", WORKLOAD, [old]))
    other, _ = read_workload("w", {"input_len": 9, "output_len": 4, "request_rates": [1, 2], "prompts": 4})
    history.append(path, history.entry("dep", "2026-12-02T00:00:00+00:00", other, [old]))
    with path.open("ab") as file:
        file.write(b'{"schema_version": 1, "at": "cut sh')  # a run killed while writing
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o022 == 0
    read = history.read(path)
    assert read.skipped == 1 and len(read.entries) == 2
    last = history.last(read.entries, "dep", WORKLOAD)
    assert last["at"] == "2026-12-01T00:00:00+00:00"  # the same workload, not the later different one
    assert history.last(read.entries, "other-dep", WORKLOAD) is None
    now = Sweep("pd", "http://a", [result(P1, ttft_p50_ms=50)])
    lines = table.change_lines({"pd": now}, last["sweeps"], last["at"])
    assert any("TTFT p50" in line and "-50.0% better" in line for line in lines), lines


def test_history_refuses_a_file_it_cannot_hold_and_ignores_entries_of_other_shapes(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"schema_version": 99}) + "\n" + json.dumps([1]) + "\nNaN\n")
    read = history.read(path)
    assert read.entries == [] and read.skipped == 3
    assert history.read(tmp_path / "absent.jsonl").entries == []
    assert "cannot read" in history.read(tmp_path).problem
