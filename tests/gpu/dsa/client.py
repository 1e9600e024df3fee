"""Talking to SGLang's native /generate with the standard library only (the device carries no HTTP
client library for this), and the arithmetic that turns streamed token timelines into decode figures.

Every exchange has a deadline on the whole of it and a bound on the bytes it reads (within, MAX_*); they are tested
against misbehaving servers, the pure parts (prompts, parse_result, decode_figures) on their own, on the CPU.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import random
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

FIRST_ID = 5  # ids 0-4 are the tokenizer's special tokens (tests/gpu/tiny_model.py); prompts avoid them


def prompts(seed: int, lengths: list[int], vocab_size: int) -> list[list[int]]:
    """Random token-id prompts, one per length, the same for a given seed on every machine."""
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab_size) for _ in range(n)] for n in lengths]


def greedy(max_new_tokens: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}


MAX_JSON_REPLY = 1 << 24  # /generate with top-5 logprobs: a recorded run's every answer together is 160 KB
MAX_TEXT_REPLY = 1 << 16
MAX_STREAM_LINE = 1 << 20  # one server-sent event of a stream


def within(timeout: float, what: str, exchange, on_timeout=None):
    """`exchange()` with `timeout` on the whole of it, a server that drips its answer included: the exchange runs in
    a daemon thread and the caller stops waiting at the deadline (`on_timeout`, e.g. shutting the connection's socket
    down, then ends the thread's reads). An exception of the exchange is raised again here."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = exchange()
        except Exception as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="pdserve-exchange", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        if on_timeout is not None:
            on_timeout()
        raise TimeoutError(f"{what} did not answer in full within {timeout:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _hang_up(sockets: dict) -> None:
    """Shut the exchange's socket down from the caller's thread: the worker's blocked read returns at once (closing
    the connection would not do it while a response still holds the socket, nor while a read holds its buffer)."""
    sock = sockets.get("sock")
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing left to hang up
            sock.shutdown(socket.SHUT_RDWR)


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r}: the tier's servers answer plain http://host:port URLs")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), path


def _post(url: str, payload: dict, timeout: float, limit: int) -> bytes:
    """POST JSON; the body of a 2xx answer, at most `limit` bytes (more raises), the whole exchange within
    `timeout`, after which the connection is shut down (SGLang aborts a request whose client went away). Any other
    status, a redirect included, raises."""
    conn, path = _connection(url, timeout)
    sockets: dict = {}

    def exchange() -> bytes:
        conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
        sockets["sock"] = conn.sock
        reply = conn.getresponse()
        if not 200 <= reply.status < 300:
            raise RuntimeError(f"{url} answered HTTP {reply.status}: {reply.read(500)!r}")
        body = reply.read(limit + 1)
        if len(body) > limit:
            raise ValueError(f"{url} answered more than {limit} bytes")
        return body

    try:
        return within(timeout, url, exchange, on_timeout=lambda: _hang_up(sockets))
    finally:
        conn.close()


def post_json(url: str, payload: dict, timeout: float):
    """POST JSON, parse the JSON answer (at most MAX_JSON_REPLY bytes; `timeout` bounds the whole exchange)."""
    return json.loads(_post(url, payload, timeout, MAX_JSON_REPLY))


def post_text(url: str, payload: dict, timeout: float) -> str:
    """POST JSON to an endpoint that answers plain text (SGLang's /start_profile): at most MAX_TEXT_REPLY bytes,
    `timeout` on the whole exchange."""
    return _post(url, payload, timeout, MAX_TEXT_REPLY).decode("utf-8", errors="replace")


def generate(base_url: str, input_ids: list[list[int]], *, max_new_tokens: int, top_logprobs: int,
             timeout: float) -> list[dict]:
    """One /generate call carrying all of `input_ids` (SGLang schedules them together), greedy, with the
    chosen tokens' logprobs and the top `top_logprobs` per position. Returns parse_result per prompt."""
    payload = {"input_ids": input_ids, "sampling_params": greedy(max_new_tokens), "return_logprob": True,
               "top_logprobs_num": top_logprobs, "return_text_in_logprobs": False}
    out = post_json(base_url + "/generate", payload, timeout)
    outs = out if isinstance(out, list) else [out]
    if len(outs) != len(input_ids):
        raise ValueError(f"/generate answered {len(outs)} results for {len(input_ids)} prompts")
    return [parse_result(o) for o in outs]


def parse_result(out: dict) -> dict:
    """The tokens and logprobs of one /generate result. SGLang gives output_token_logprobs as
    [logprob, token_id, text|None] per generated token and output_top_logprobs as a list of such
    triples per position."""
    meta = out["meta_info"]
    chosen = meta.get("output_token_logprobs") or []
    ids = list(out.get("output_ids") or [t[1] for t in chosen])
    if [t[1] for t in chosen] != ids:
        raise ValueError("output_ids and output_token_logprobs disagree on the tokens")
    top = [[[t[1], _logprob(t[0])] for t in (position or [])] for position in (meta.get("output_top_logprobs") or [])]
    return {
        "output_ids": ids,
        "logprobs": [_logprob(t[0]) for t in chosen],
        "top_logprobs": top,  # per position: [[token_id, logprob], ...]
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "e2e_latency_s": meta.get("e2e_latency"),
    }


def _logprob(value) -> float:
    """A logprob as SGLang's JSON carries it: orjson writes NaN and +-inf as null, which comes back as NaN here so
    that the verdict's non-finite check sees it (diff.py counts them)."""
    return math.nan if value is None else float(value)


def stream_timeline(base_url: str, input_ids: list[int], *, max_new_tokens: int, timeout: float,
                    start: threading.Event | None = None) -> list[tuple[float, int]]:
    """Stream one greedy request; (time.perf_counter(), completion tokens so far) per chunk received. `timeout`
    bounds the whole stream (waiting for `start` included), each event line at most MAX_STREAM_LINE bytes."""
    conn, _ = _connection(base_url, timeout)
    body = json.dumps({"input_ids": input_ids, "sampling_params": greedy(max_new_tokens), "stream": True})
    sockets: dict = {}

    def exchange() -> list[tuple[float, int]]:
        timeline: list[tuple[float, int]] = []
        if start is not None:
            start.wait(timeout)
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        sockets["sock"] = conn.sock
        reply = conn.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"/generate stream answered HTTP {reply.status}: {reply.read(500)!r}")
        while True:
            line = reply.readline(MAX_STREAM_LINE + 1)
            if len(line) > MAX_STREAM_LINE:
                raise ValueError(f"/generate stream sent a line over {MAX_STREAM_LINE} bytes")
            if not line:
                raise RuntimeError("/generate stream ended without [DONE]")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return timeline
            chunk = json.loads(data)
            if "error" in chunk:  # SGLang reports an error inside the stream, then [DONE]
                raise RuntimeError(f"/generate stream reported an error: {str(chunk['error'])[:500]}")
            timeline.append((time.perf_counter(), int(chunk["meta_info"]["completion_tokens"])))

    try:
        return within(timeout, f"{base_url}/generate stream", exchange, on_timeout=lambda: _hang_up(sockets))
    finally:
        conn.close()


def concurrent_timelines(base_url: str, batch: list[list[int]], *, max_new_tokens: int,
                         timeout: float) -> list[list[tuple[float, int]]]:
    """Stream all of `batch` at once (one thread each, released together); every stream's timeline."""
    start = threading.Event()
    results: list = [None] * len(batch)

    def run(i: int) -> None:
        try:
            results[i] = stream_timeline(base_url, batch[i], max_new_tokens=max_new_tokens, timeout=timeout,
                                         start=start)
        except Exception as exc:  # noqa: BLE001 - reported below, with the others
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(batch))]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(timeout + 10)
    failed = [r for r in results if not isinstance(r, list)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(batch)} streams failed: {failed[0]!r}")
    return results


@dataclass(frozen=True)
class DecodeFigures:
    ms_per_step: float      # one decode step of the whole batch
    tokens_per_s: float     # generated tokens per second, all requests together
    steps: float            # decode steps per request inside the measured window
    window_s: float
    ttft_s: float           # median time to the first token (prefill of the batch included)


def decode_figures(timelines: list[list[tuple[float, int]]], sent_at: float) -> DecodeFigures:
    """Decode speed of a batch from its streams: only the window in which every request was decoding
    counts (from the last request's first token to the first request's last token), so prefills of
    late requests do not inflate the steps. Tokens in the window are those whose arrival falls inside it."""
    if not timelines or any(len(t) < 2 for t in timelines):
        raise ValueError("every stream needs at least two chunks")
    t0 = max(t[0][0] for t in timelines)
    t1 = min(t[-1][0] for t in timelines)
    window = t1 - t0
    if window <= 0:
        raise ValueError("the streams never all decoded at the same time: raise max_new_tokens")
    tokens = []
    for timeline in timelines:
        before = max(n for when, n in timeline if when <= t0)
        upto = max(n for when, n in timeline if when <= t1)
        tokens.append(upto - before)
    steps = sum(tokens) / len(tokens)
    if steps <= 0:
        raise ValueError("no token arrived inside the common decode window")
    firsts = sorted(t[0][0] - sent_at for t in timelines)
    return DecodeFigures(ms_per_step=1000.0 * window / steps, tokens_per_s=sum(tokens) / window, steps=steps,
                         window_s=window, ttft_s=firsts[len(firsts) // 2])
