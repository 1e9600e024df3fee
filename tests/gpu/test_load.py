"""The crash-under-load arithmetic and the load generator, on the CPU: made-up timelines for `summarize`,
and the real openai client against a small local HTTP server that answers, fails and goes away."""

from __future__ import annotations

import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from tests.fixtures.json_http import JsonHandler
from tests.gpu.load import (
    EMPTY,
    OK,
    ChatLoad,
    Outcome,
    PortProber,
    longest_refused,
    succeeding_again,
    summarize,
    timeline,
)


def o(sent, ended, cause=OK, detail=""):
    return Outcome(sent, ended, cause, detail)


def test_summary_counts_failures_by_cause_and_when_they_were_sent():
    kill = 100.0
    outcomes = [
        o(90, 90.2), o(95, 95.2),
        o(99.9, 108.0, "HTTP 503", "in transfer at the kill"),  # in flight at the kill
        o(101, 108.0, "HTTP 503"), o(105, 105.5, "HTTP 503"), o(120, 120.1, "timeout"),
        o(140, 140.2), o(141, 141.1),  # succeeding again at 140
    ]
    s = summarize(outcomes, kill, ready_at=137.0, samples=[(99.0, True), (130.0, True)])
    assert (s.sent, s.ok, s.failed) == (8, 4, 4)
    assert s.causes == {"HTTP 503": 3, "timeout": 1}
    assert (s.failed_in_flight, s.failed_sent_after, s.failed_before) == (1, 3, 0)
    assert s.first_failure_s == pytest.approx(5.5)
    assert s.answered_again_s == pytest.approx(40.2)
    assert s.all_succeed_from_s == pytest.approx(40.0)
    assert s.worker_ready_s == pytest.approx(37.0)
    assert s.beyond_ready_s == pytest.approx(3.2)
    assert s.longest_without_success_s == pytest.approx(140.2 - 95.2)
    assert s.slowest_success_after_kill_s == pytest.approx(0.2)
    assert s.details == ("HTTP 503: in transfer at the kill",)


def test_requests_held_through_the_outage_count_by_when_they_are_answered():
    # As sglang-router 0.3.2 (before smg) did on the H200: requests sent after the kill are held, the early ones fail
    # together ~45 s later, the later ones are all answered once the prefill is back.
    kill = 0.0
    outcomes = [o(-1, -0.97), o(1, 46, "HTTP 503"), o(20, 66, "HTTP 503"), o(21, 70.1), o(40, 70.2), o(71, 71.05)]
    s = summarize(outcomes, kill, ready_at=64.0, samples=[])
    assert s.first_failure_s == pytest.approx(46)
    assert s.answered_again_s == pytest.approx(70.1)  # not 21, when the request was sent
    assert s.all_succeed_from_s == pytest.approx(21)
    assert s.beyond_ready_s == pytest.approx(6.1)
    assert s.longest_without_success_s == pytest.approx(70.1 + 0.97)
    assert s.slowest_success_after_kill_s == pytest.approx(49.1)


def test_the_timeline_lists_every_request_relative_to_the_kill_in_send_order():
    assert timeline([o(12.0, 12.5, "HTTP 503"), o(9.0, 9.25)], 10.0) == [[-1.0, -0.75, OK], [2.0, 2.5, "HTTP 503"]]


def test_a_success_between_failures_is_not_recovery_and_a_failing_end_is_never():
    outcomes = [o(10, 10.1, "HTTP 503"), o(11, 11.1), o(12, 12.1, "HTTP 503"), o(13, 13.1)]
    s = summarize(outcomes, 9.0, None, [])
    assert s.all_succeed_from_s == pytest.approx(4.0) and s.answered_again_s == pytest.approx(2.1)
    ends_failing = [*outcomes, o(14, 14.1, "HTTP 500")]
    s = summarize(ends_failing, 9.0, None, [])
    assert s.all_succeed_from_s is None and s.worker_ready_s is None and s.beyond_ready_s is None
    assert s.longest_without_success_s == pytest.approx(2.0)  # 11.1 -> 13.1, between the two successes


def test_no_failures_means_never_down_and_failures_before_the_kill_are_counted_apart():
    s = summarize([o(1, 2), o(3, 4)], 2.5, 3.0, [])
    assert s.all_succeed_from_s == 0.0 and s.answered_again_s == pytest.approx(1.5)
    s = summarize([o(1, 1.5, "HTTP 500"), o(3, 4)], 2.5, 3.0, [])
    assert (s.failed_before, s.failed_in_flight, s.failed_sent_after) == (1, 0, 0)


def test_longest_refused_window_runs_from_the_first_refusal_to_the_next_accept():
    samples = [(0.0, True), (1.0, False), (1.5, False), (2.0, True), (3.0, False), (6.5, True), (7.0, False)]
    assert longest_refused(samples) == pytest.approx(3.5)
    assert longest_refused([(0.0, True), (1.0, False), (4.0, False)]) == pytest.approx(3.0)  # still refused at the end
    assert longest_refused([(0.0, True), (1.0, True)]) == 0.0
    assert longest_refused([]) == 0.0


def test_succeeding_again_needs_the_last_streak_after_the_restart_to_succeed():
    outcomes = [o(1, 2, "HTTP 503"), o(5, 5.1), o(6, 6.1), o(7, 7.1)]
    assert succeeding_again(outcomes, after=4, streak=3)
    assert not succeeding_again(outcomes, after=4, streak=4)  # only three sent after 4
    assert not succeeding_again([*outcomes, o(8, 8.1, "timeout")], after=4, streak=3)


class _Chat(JsonHandler):
    """Chat completions while `mode` is "ok", 503 while "down", a 200 without tokens while "empty"."""

    mode = "ok"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != "Bearer k":
            self.send_json(401, {"error": {"message": "Invalid API key", "code": 401}})
            return
        if self.mode == "down":
            self.send_json(503, {"error": {"message": "No available prefill workers", "code": 503}})
            return
        tokens = 0 if self.mode == "empty" else 3
        self.send_json(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "finish_reason": "length",
                                      "message": {"role": "assistant", "content": "abc" if tokens else ""}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}})


def _serve(port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run_load(port, seconds, key="k", rate=20.0):
    load = ChatLoad(f"http://127.0.0.1:{port}/v1", key, "m", rate=rate, timeout=5).start()
    time.sleep(seconds)
    return load


def test_the_load_counts_answers_http_errors_silent_answers_and_refusals_by_cause():
    pytest.importorskip("openai")
    server = _serve()
    port = server.server_address[1]
    prober = PortProber("127.0.0.1", port).start()
    load = _run_load(port, 0.5)
    _Chat.mode = "down"
    time.sleep(0.5)
    _Chat.mode = "empty"
    time.sleep(0.3)
    _Chat.mode = "ok"
    server.shutdown()
    server.server_close()
    time.sleep(0.5)  # nothing listens: refused
    _serve(port)  # back on the same port
    time.sleep(0.5)
    outcomes = load.stop()
    prober.stop()
    causes = {o.cause for o in outcomes}
    assert {OK, "HTTP 503", EMPTY, "connection refused"} <= causes, causes
    # A request the closing server was still reading can end reset or closed instead of refused.
    assert causes <= {OK, "HTTP 503", EMPTY, "connection refused", "connection reset",
                      "connection closed without an answer"}, \
        [(o.cause, o.detail) for o in outcomes if o.cause.startswith("connection")]
    assert any("No available prefill workers" in o.detail for o in outcomes if o.cause == "HTTP 503")
    assert outcomes[-1].ok or succeeding_again(outcomes, outcomes[-1].sent - 0.2, 1)
    assert 0.3 <= longest_refused(prober.samples) <= 3.0
    assert 40 <= len(outcomes) <= 60  # 20 req/s for about 2.3 s


def test_a_wrong_key_is_an_http_401_and_a_silent_port_is_a_timeout():
    pytest.importorskip("openai")
    server = _serve()
    load = _run_load(server.server_address[1], 0.3, key="wrong")
    assert {o.cause for o in load.stop()} == {"HTTP 401"}
    server.shutdown()
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        load = ChatLoad(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "k", "m", rate=5, timeout=0.5).start()
        time.sleep(0.3)
        began = time.monotonic()
        outcomes = load.stop()
        assert time.monotonic() - began < 3  # stop waits only for the requests' own timeouts
    assert outcomes and {o.cause for o in outcomes} == {"timeout"}
