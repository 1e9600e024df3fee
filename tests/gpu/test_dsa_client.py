"""The DSA tier's HTTP client (tests/gpu/dsa/client.py) against misbehaving servers, on the CPU: every exchange
(/generate as JSON, the /generate stream, /start_profile's text) ends by its deadline however the server drips,
reads no more than its bound, and raises on an error status, a redirect, a stream that breaks off or reports an
error (SGLang 0.5.17's http_server.py sends `data: {"error": ...}` then `data: [DONE]`)."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.gpu.dsa import client


def _serve(handler_body, protocol: str = "HTTP/1.0"):
    """A local HTTP server whose POST handler is `handler_body(handler)`; returns (server, base url)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = protocol

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            handler_body(self)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _answer(status: int, body: bytes, drip_s: float = 0.0, headers: dict | None = None):
    def handle(h):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not drip_s:
            h.wfile.write(body)
            return
        for byte in body:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(drip_s)
    return handle


@pytest.fixture
def serve():
    servers = []

    def start(handler_body, protocol: str = "HTTP/1.0"):
        httpd, url = _serve(handler_body, protocol)
        servers.append(httpd)
        return url

    yield start
    for httpd in servers:
        httpd.shutdown()


def _bounded(call, limit_s: float, error):
    """`call()` raises `error` and returns within `limit_s` (the deadline held for the whole exchange)."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        call()
    assert time.monotonic() - started < limit_s
    return caught.value


# --- one POST, one answer ------------------------------------------------------------------------------


def test_post_text_and_post_json_read_a_plain_answer(serve):
    assert client.post_text(serve(_answer(200, b"Start profiling.\n")) + "/start_profile", {"num_steps": 4},
                            timeout=5) == "Start profiling.\n"
    answer = [{"meta_info": {"output_token_logprobs": []}}]
    assert client.post_json(serve(_answer(200, json.dumps(answer).encode())) + "/generate", {}, timeout=5) == answer


@pytest.mark.parametrize("post, bound", [(client.post_text, "MAX_TEXT_REPLY"), (client.post_json, "MAX_JSON_REPLY")])
@pytest.mark.parametrize("status, body, drip_s, headers, error", [
    (200, b"[" + b" " * 40 + b"]", 0.2, None, TimeoutError),         # drips past the whole deadline
    (200, b"[" + b" " * 3000 + b"]", 0.0, None, ValueError),          # longer than the bound
    (500, b"Profiling is already in progress", 0.0, None, Exception),  # SGLang's error answer
    (302, b"", 0.0, {"Location": "http://127.0.0.1:9/elsewhere"}, Exception),  # a redirect to nowhere
])
def test_posts_refuse_misbehaving_servers(serve, monkeypatch, post, bound, status, body, drip_s, headers, error):
    monkeypatch.setattr(client, bound, 2000)
    url = serve(_answer(status, body, drip_s, headers)) + "/generate"
    _bounded(lambda: post(url, {}, timeout=1.5), 3.0, error)


def test_post_json_refuses_an_answer_that_is_not_json(serve):
    url = serve(_answer(200, b"<html>busy</html>")) + "/generate"
    _bounded(lambda: client.post_json(url, {}, timeout=2), 3.0, json.JSONDecodeError)


# --- the /generate stream ------------------------------------------------------------------------------


def _events(*events: bytes, drip_s: float = 0.0, status: int = 200):
    def handle(h):
        h.send_response(status)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for event in events:
            if drip_s:
                for byte in event:
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
                    time.sleep(drip_s)
            else:
                h.wfile.write(event)
                h.wfile.flush()
    return handle


def _chunk(n: int) -> bytes:
    return b"data: " + json.dumps({"meta_info": {"completion_tokens": n}}).encode() + b"\n\n"


def test_a_stream_gives_one_timeline_entry_per_chunk(serve):
    url = serve(_events(_chunk(1), b": keep-alive\n\n", _chunk(2), _chunk(3), b"data: [DONE]\n\n"))
    timeline = client.stream_timeline(url, [5, 6], max_new_tokens=3, timeout=5)
    assert [n for _, n in timeline] == [1, 2, 3]
    assert [t for t, _ in timeline] == sorted(t for t, _ in timeline)


@pytest.mark.parametrize("events, drip_s, status, error, words", [
    ((_chunk(1), b"data: " + b"7" * 200), 0.05, 200, TimeoutError, "within"),   # drips one line past the deadline
    ((_chunk(1), b"data: " + b"7" * 5000 + b"\n\n"), 0.0, 200, ValueError, "line over"),  # a line over the bound
    ((_chunk(1), _chunk(2)), 0.0, 200, RuntimeError, "without [DONE]"),           # breaks off
    ((b'data: {"error": {"message": "prompt too long", "code": 400}}\n\n', b"data: [DONE]\n\n"), 0.0, 200,
     RuntimeError, "prompt too long"),                                            # SGLang's in-stream error
    ((b"no\n",), 0.0, 503, RuntimeError, "HTTP 503"),
])
def test_a_stream_from_a_misbehaving_server_raises_by_its_deadline(serve, monkeypatch, events, drip_s, status, error,
                                                                    words):
    monkeypatch.setattr(client, "MAX_STREAM_LINE", 4096)
    url = serve(_events(*events, drip_s=drip_s, status=status))
    caught = _bounded(lambda: client.stream_timeline(url, [5], max_new_tokens=2, timeout=1.5), 3.0, error)
    assert words in str(caught)


def test_concurrent_streams_name_the_one_that_failed(serve):
    calls = []

    def handle(h):
        calls.append(1)
        (_events(_chunk(1), _chunk(2), b"data: [DONE]\n\n") if len(calls) % 2 else _events(_chunk(1)))(h)

    url = serve(handle)
    caught = _bounded(lambda: client.concurrent_timelines(url, [[5], [6]], max_new_tokens=2, timeout=2), 15.0,
                      RuntimeError)
    assert "1 of 2 streams failed" in str(caught) and "without [DONE]" in str(caught)


# --- a server that stops answering mid-way: the exchange's thread must end too -------------------------


def _exchange_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pdserve-exchange"]


def _hangs_after_one_chunk(chunked: bool):
    """HTTP/1.1 (the connection stays open): a first piece of the answer, then silence for longer than any test."""
    def handle(h):
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked") if chunked else h.send_header("Content-Length", "100000")
        h.end_headers()
        piece = _chunk(1)
        h.wfile.write((b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece)
        h.wfile.flush()
        time.sleep(20)
    return handle


@pytest.mark.parametrize("call", ["stream", "post_json"])
def test_the_exchange_is_hung_up_at_the_deadline(serve, call):
    url = serve(_hangs_after_one_chunk(chunked=call == "stream"), protocol="HTTP/1.1")
    if call == "stream":
        exchange = lambda: client.stream_timeline(url, [5], max_new_tokens=2, timeout=1.5)  # noqa: E731
    else:
        exchange = lambda: client.post_json(url + "/generate", {}, timeout=1.5)  # noqa: E731
    _bounded(exchange, 3.0, TimeoutError)
    # The connection was closed, so the thread reading it ends now, not when the server gives up (20 s).
    deadline = time.monotonic() + 3.0
    while _exchange_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _exchange_threads()


# --- logprobs SGLang could not write as numbers ---------------------------------------------------------


def test_null_logprobs_from_sglangs_json_are_nan_and_fail_the_verdict():
    """SGLang serializes with orjson, which writes NaN and +-inf as null."""
    from tests.gpu.dsa import diff, verdict

    def result(lp: str) -> dict:
        raw = ('{"output_ids": [7, 8], "meta_info": {"output_token_logprobs": [[-0.1, 7, null], [LP, 8, null]], '
               '"output_top_logprobs": [[[-0.1, 7, null]], [[LP, 8, null]]]}}').replace("LP", lp)
        return client.parse_result(json.loads(raw))

    ok, bad = result("-0.2"), result("null")
    assert ok["logprobs"] == [-0.1, -0.2]
    assert math.isnan(bad["logprobs"][1]) and math.isnan(bad["top_logprobs"][1][0][1])
    run = lambda r: {"compare": {"seed": 0, "prompt_lens": [9], "max_new_tokens": 2,  # noqa: E731
                                 "sets": {"sequential": [r]}}}
    compared = diff.compare_runs(run(ok), run(bad))
    assert compared["rows"][0]["nonfinite_logprobs"] == 2
    (fail,) = verdict.diff_failures(compared)
    assert "2 logprobs are NaN or infinite" in fail
