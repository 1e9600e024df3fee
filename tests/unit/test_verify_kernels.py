"""kernels.<role> (issue 16 item 4): what pdserve's SGLang plugin logged in a server's current invocation,
read back (pdserve.probes.kernel_log, pdserve.probes.journal.grep_invocation) and judged against the
deployment's attention_kernels (pdserve.verify.checks.kernels)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import httpx
import pytest

from pdserve.probes import journal, kernel_log
from pdserve.probes.observations import Unavailable
from pdserve.probes.systemctl import Systemctl, UnitState
from pdserve.verify import context, runner
from pdserve.verify.checks.kernels import KernelsAsked, check_kernels
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import checks_for

INVOCATION = "5f0c1d2e3a4b5c6d7e8f9a0b1c2d3e4f"
ASKED = KernelsAsked("decode", "sglang-dsv4-decode", "pdserve", 2)
ACTIVE = UnitState("sglang-dsv4-decode.service", load_state="loaded", active_state="active", sub_state="running",
                   invocation_id=INVOCATION)


def status_line(rank: int | None, indexer: str = "pdserve", mla: str = "pdserve", requested: str = "pdserve",
                reasons: dict[str, str] | None = None, stamp: str = "[2026-12-01 15:00:00 TP{rank}] ") -> str:
    """A status line as it reaches the journal: SGLang's log prefix, then the plugin's message."""
    data = {"requested": requested, "kernels": {"indexer_topk": indexer, "sparse_mla_decode": mla},
            "reasons": reasons or {}, "tp_rank": rank, "device": f"cuda:{rank or 0}", "sm": "9.0",
            "sglang": "0.5.23", "pdserve_kernels": "0.1.0"}
    return stamp.format(rank=rank) + kernel_log.STATUS_PREFIX + json.dumps(data)


def fallback_line(op: str = "sparse_mla_decode", reason: str = "v_head_dim 128 (the kernels write 512)") -> str:
    return "[2026-12-01 15:01:00 TP0] " + kernel_log.FALLBACK_PREFIX + json.dumps(
        {"op": op, "reason": reason, "shape": "(4, 16, 576)"})


def judged(lines: list[str], state: UnitState = ACTIVE, asked: KernelsAsked = ASKED, incomplete=None):
    return check_kernels(asked, state, kernel_log.parse(lines), incomplete)


# --- the line format ------------------------------------------------------------------------------------

def test_the_parser_reads_status_fallback_and_ran_lines_behind_sglangs_log_prefix():
    log = kernel_log.parse([
        "[2026-12-01 15:00:00] Load weight end.",
        status_line(0), status_line(1, mla="sglang", reasons={"sparse_mla_decode": "kv_cache_dim 656"}),
        fallback_line(),
        "[2026-12-01 15:01:00 TP0] " + kernel_log.RAN_PREFIX + '{"op": "indexer_topk", "shape": "(4, 64, 128)"}',
        "pdserve-kernels status: {not json",
    ])
    assert [(s.tp_rank, s.kernel("indexer_topk"), s.kernel("sparse_mla_decode")) for s in log.statuses] == [
        (0, "pdserve", "pdserve"), (1, "pdserve", "sglang")]
    assert log.statuses[1].reasons == {"sparse_mla_decode": "kv_cache_dim 656"}
    assert log.statuses[0].device == "cuda:0" and log.statuses[0].sglang == "0.5.23"
    assert log.fallbacks == (kernel_log.KernelEvent("sparse_mla_decode", "(4, 16, 576)",
                                                    "v_head_dim 128 (the kernels write 512)"),)
    assert log.ran == (kernel_log.KernelEvent("indexer_topk", "(4, 64, 128)"),)
    assert log.unreadable == ("pdserve-kernels status: {not json",)


def test_a_status_without_an_op_or_rank_is_read_as_missing_not_as_pdserve():
    log = kernel_log.parse([kernel_log.STATUS_PREFIX + '{"requested": "pdserve", "kernels": {}, "tp_rank": true}'])
    (status,) = log.statuses
    assert status.tp_rank is None and status.kernel("indexer_topk") == "missing"


def test_the_plugins_own_writer_gives_lines_this_reader_reads(monkeypatch):
    """The contract: kernels/python/pdserve_kernels/sglang_plugin/status.py writes, pdserve reads."""
    import logging
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "kernels" / "python"))
    for name in [m for m in sys.modules if m.startswith("pdserve_kernels")]:
        monkeypatch.delitem(sys.modules, name)
    from pdserve_kernels.sglang_plugin import status as writer

    assert (writer.STATUS_PREFIX, writer.FALLBACK_PREFIX, writer.RAN_PREFIX, writer.OPS) == (
        kernel_log.STATUS_PREFIX, kernel_log.FALLBACK_PREFIX, kernel_log.RAN_PREFIX, kernel_log.OPS)
    written: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            written.append("[2026-12-01 15:00:00 TP3] " + record.getMessage())

    handler = Keep()
    writer.logger.addHandler(handler)
    try:
        writer.log_status(writer.Status(requested="pdserve", kernels={"indexer_topk": "pdserve",
                                                                      "sparse_mla_decode": "sglang"},
                                        reasons={"sparse_mla_decode": "why"}, tp_rank=3, device="cuda:3", sm="9.0",
                                        sglang="0.5.23", pdserve_kernels="0.1.0"))
        writer.FallbackLog().note("indexer_topk", "next_n 2", "(8, 64, 128)")
        writer.RanLog().note("sparse_mla_decode", "(8, 16, 576)")
    finally:
        writer.logger.removeHandler(handler)
    log = kernel_log.parse(written)
    assert log.unreadable == ()
    (status,) = log.statuses
    assert (status.requested, status.kernels, status.reasons, status.tp_rank, status.device, status.sm) == (
        "pdserve", {"indexer_topk": "pdserve", "sparse_mla_decode": "sglang"}, {"sparse_mla_decode": "why"}, 3,
        "cuda:3", "9.0")
    assert log.fallbacks == (kernel_log.KernelEvent("indexer_topk", "(8, 64, 128)", "next_n 2"),)
    assert log.ran == (kernel_log.KernelEvent("sparse_mla_decode", "(8, 16, 576)"),)


# --- the judgement ---------------------------------------------------------------------------------------

def test_not_asked_is_said_and_is_no_failure():
    result = check_kernels(replace(ASKED, requested="sglang"), None, None)
    assert result.status == "skip" and 'decode.attention_kernels = "sglang"' in result.observed


def test_every_rank_on_pdserves_kernels_passes():
    result = judged([status_line(0), status_line(1)])
    assert result.status == "pass" and result.observed == "pdserve's kernels on all 2 TP rank(s)"
    assert any("TP rank 1: indexer_topk pdserve, sparse_mla_decode pdserve" in d for d in result.details)


def test_a_rank_on_sglangs_kernel_fails_with_the_plugins_reason():
    result = judged([status_line(0), status_line(1, indexer="sglang", reasons={"indexer_topk": "sm 8.0"})])
    assert result.status == "fail"
    assert result.observed == "TP rank 1: indexer_topk: sglang (sm 8.0)"


def test_a_process_started_without_the_switch_says_restart():
    result = judged([status_line(0, "sglang", "sglang", requested="sglang"), status_line(1)])
    assert result.status == "fail" and "PDSERVE_DSA_KERNELS=sglang" in result.observed
    assert result.remediation.startswith("restart sglang-dsv4-decode")


def test_a_ready_server_with_a_silent_rank_fails_and_names_the_plugin():
    result = judged([status_line(0)])
    assert result.status == "fail" and result.observed.endswith("none from TP rank(s) 1")
    assert "sglang.srt.plugins" in result.remediation
    nothing = judged([])
    assert nothing.status == "fail" and nothing.observed.startswith("no pdserve-kernels status line")


def test_a_node_of_a_multi_node_server_is_judged_on_its_own_ranks():
    second_node = replace(ASKED, first_rank=2)
    assert judged([status_line(2), status_line(3)], asked=second_node).status == "pass"
    result = judged([status_line(0), status_line(1)], asked=second_node)
    assert result.status == "fail" and result.observed.endswith("none from TP rank(s) 2, 3")
    assert "TP rank 2-3" in result.expected


def test_a_server_still_starting_fails_as_not_ready_so_wait_retries():
    starting = replace(ACTIVE, active_state="activating", sub_state="start-post")
    result = judged([status_line(0)], state=starting)
    assert result.status == "fail" and "not ready yet" in result.observed and "--wait" in result.remediation


def test_a_scan_cut_short_does_not_claim_a_rank_is_silent():
    result = judged([status_line(0)], incomplete="journalctl did not finish within 10 s (5 lines read)")
    assert result.status == "skip" and "stopped early" in result.observed


def test_run_time_fallbacks_warn_with_their_reasons():
    result = judged([status_line(0), status_line(1), fallback_line()])
    assert result.status == "warn" and "1 run-time fallback(s)" in result.observed
    assert "fallback: sparse_mla_decode: v_head_dim 128 (the kernels write 512) (shape (4, 16, 576))" in result.details


def test_a_stopped_worker_fails_and_a_stopped_fallback_skips():
    stopped = replace(ACTIVE, active_state="inactive", sub_state="dead")
    assert judged([], state=stopped).status == "fail"
    fallback = KernelsAsked("fallback", "sglang-dsv4", "pdserve", 1)
    assert judged([], state=stopped, asked=fallback).status == "skip"


# --- the registered checks, through a Context -------------------------------------------------------------

def test_one_check_per_sglang_server(reference):
    checks = checks_for(expectations(reference))
    assert [i for i in checks if i.startswith("kernels.")] == ["kernels.prefill", "kernels.decode", "kernels.fallback"]


def test_the_gatherer_reads_the_current_invocation_of_the_unit(reference_data, monkeypatch):
    from pdserve.schema.loading import deployment_from_data

    reference_data["decode"]["attention_kernels"] = "pdserve"
    dep = deployment_from_data(reference_data, "t").deployment
    asked: list = []

    def show(argv, **kwargs):
        unit = argv[-1]
        return subprocess.CompletedProcess(argv, 0, f"Id={unit}\nLoadState=loaded\nActiveState=active\n"
                                           f"SubState=running\nInvocationID={INVOCATION}\n", "")

    def grep(invocation_id, needle, timeout):
        asked.append((invocation_id, needle))
        return journal.InvocationScan(tuple(status_line(r) for r in range(dep.decode.tensor_parallel)))

    monkeypatch.setattr(context, "unavailable_reason", lambda: None)
    monkeypatch.setattr(journal, "grep_invocation", grep)
    with httpx.Client() as client:
        ctx = runner.Context(dep, expectations(dep), runner.Options(), client, Systemctl(runner=show))
        checks = checks_for(ctx.exp)
        results = {i: checks[i](ctx) for i in ("kernels.prefill", "kernels.decode")}
    assert results["kernels.prefill"].status == "skip"  # not asked: no journal read
    assert results["kernels.decode"].status == "pass", results["kernels.decode"]
    assert asked == [(INVOCATION, kernel_log.MARK)]


# --- reading one invocation from journald ------------------------------------------------------------------

@pytest.fixture
def fake_journalctl(tmp_path, monkeypatch):
    """A journalctl on PATH that prints $FAKE_JOURNAL (or sleeps with $FAKE_SLEEP) and records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "journalctl"
    script.write_text('#!/bin/sh\necho "$@" > "$FAKE_ARGV"\n[ -n "$FAKE_SLEEP" ] && { cat "$FAKE_JOURNAL"; '
                      'exec sleep "$FAKE_SLEEP"; }\n[ -n "$FAKE_FAIL" ] && { echo "$FAKE_FAIL" >&2; exit 1; }\n'
                      'cat "$FAKE_JOURNAL"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ARGV", str(tmp_path / "argv"))
    monkeypatch.setenv("FAKE_JOURNAL", str(tmp_path / "journal"))
    (tmp_path / "journal").write_text("\n".join(["starting", status_line(0), "noise", fallback_line()]) + "\n")
    return tmp_path


def test_grep_invocation_asks_for_the_invocation_and_keeps_the_plugins_lines(fake_journalctl):
    scan = journal.grep_invocation(INVOCATION, kernel_log.MARK, timeout=10)
    assert scan == journal.InvocationScan((status_line(0), fallback_line()))
    assert (fake_journalctl / "argv").read_text().split() == [f"_SYSTEMD_INVOCATION_ID={INVOCATION}", "-o", "cat",
                                                             "--no-pager"]


def test_grep_invocation_is_bounded_in_time_and_lines_and_keeps_what_it_read(fake_journalctl, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "30")
    scan = journal.grep_invocation(INVOCATION, kernel_log.MARK, timeout=0.5)
    assert scan.lines == (status_line(0), fallback_line()) and "did not finish within 0.5 s" in scan.incomplete
    monkeypatch.delenv("FAKE_SLEEP")
    scan = journal.grep_invocation(INVOCATION, kernel_log.MARK, timeout=10, max_lines=2)
    assert scan.lines == (status_line(0),) and scan.incomplete == "stopped after the first 2 lines"


def test_grep_invocation_refuses_what_is_no_invocation_and_reports_journalctl_failing(fake_journalctl, monkeypatch):
    with pytest.raises(ValueError):
        journal.grep_invocation("-n 5", kernel_log.MARK, timeout=1)
    monkeypatch.setenv("FAKE_FAIL", "Failed to open journal")
    with pytest.raises(Unavailable, match="Failed to open journal"):
        journal.grep_invocation(INVOCATION, kernel_log.MARK, timeout=10)
