"""The load generator's bookkeeping (tests/fixtures/loadgen.py): causes, refused windows, the summary."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from loadgen import OK, SILENT, Load, Outcome, PortProber, classify_error, classify_response, summarize

ANSWER = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}


def test_only_a_chat_completion_with_text_is_ok():
    assert classify_response(200, ANSWER) == (OK, "")
    assert classify_response(200, {"choices": [{"message": {"content": ""}}]})[0] == SILENT
    assert classify_response(200, "<html>")[0] == SILENT
    assert classify_response(200, {"object": "list"})[0] == SILENT
    cause, detail = classify_response(503, {"error": {"message": "No available prefill workers"}})
    assert cause == "HTTP 503" and "prefill" in detail


def test_client_errors_are_named_by_cause():
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert classify_error(refused) == "connection refused"
    assert classify_error(httpx.ReadTimeout("timed out")) == "timeout"
    assert classify_error(httpx.RemoteProtocolError("Server disconnected")) == "connection closed mid-request"
    assert classify_error(httpx.ReadError("reset")) == "connection reset"


def test_refused_windows_run_from_the_first_refusal_to_the_next_accept():
    prober = PortProber("127.0.0.1", 1)
    prober.samples = [(0.0, True), (1.0, False), (1.5, False), (2.0, True), (3.0, False)]
    assert prober.refused_windows() == [(1.0, 2.0), (3.0, 3.0)]
    assert prober.longest_refused() == 1.0


def test_summary_counts_in_flight_failures_apart_and_the_recovery():
    load = Load("http://127.0.0.1:1")
    load.outcomes = [
        Outcome(0.0, 0.1, OK),
        Outcome(9.5, 11.0, "connection closed mid-request"),  # in flight at the fault (t=10)
        Outcome(10.5, 10.6, "HTTP 503", "no workers"),  # sent after it
        Outcome(12.0, 12.1, OK),
        Outcome(13.0, 13.1, SILENT, "empty answer"),
        Outcome(14.0, 14.1, OK),
    ]
    s = summarize("x", load, None, fault_at=10.0)
    assert (s.sent, s.failed, s.failed_in_flight, s.failed_other, s.silent) == (6, 3, 1, 2, 1)
    assert s.recovered_s == 4.0  # the first success after the last failure started at 14.0
    assert s.causes == {"connection closed mid-request": 1, "HTTP 503": 1, SILENT: 1}
