"""Bounded chat load through the public port with the official openai client, a connect prober of that
port, and what a client saw around a fault, counted by cause.

Every wait is bounded: each request has its own timeout (the client never retries), the run ends when
the caller stops it or at its deadline, and `stop()` joins with deadlines. `summarize` is a pure function
of the recorded outcomes, so its arithmetic is tested on the CPU with made-up timelines.
"""

from __future__ import annotations

import errno
import itertools
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# The public port's connect prober is the fault tier's own (the same 20 Hz bounded connects).
from tests.fixtures.loadgen import PortProber  # noqa: F401 (crash.py and the tests take it from here)

OK = "ok"
EMPTY = "200 without tokens"  # an answer the client would take for one: a silent failure


@dataclass(frozen=True)
class Outcome:
    sent: float  # time.monotonic() when the request was sent
    ended: float
    cause: str  # OK, EMPTY, "HTTP 503", "connection refused", "timeout", "connection error", ...
    detail: str = ""
    retry_after: str | None = None  # an HTTP error's Retry-After header, as sent (a client's cue to come back)

    @property
    def ok(self) -> bool:
        return self.cause == OK


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def classify(exc: Exception) -> tuple[str, str]:
    """(cause, detail) of a request the openai client raised for, in words a table can count."""
    import openai

    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return "timeout", ""
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        message = error.get("message") or error.get("code") or error.get("detail") or exc.message
        return f"HTTP {exc.status_code}", str(message)[:160]
    if isinstance(exc, openai.APIConnectionError):
        for link in _chain(exc):
            if isinstance(link, ConnectionRefusedError) or getattr(link, "errno", None) == errno.ECONNREFUSED:
                return "connection refused", ""
            if isinstance(link, ConnectionResetError) or getattr(link, "errno", None) == errno.ECONNRESET:
                return "connection reset", ""
        if "refused" in " ".join(str(link) for link in _chain(exc)).lower():
            return "connection refused", ""
        if any(type(link).__name__ == "RemoteProtocolError" for link in _chain(exc)):
            return "connection closed without an answer", ""
        return "connection error", f"{type(exc.__cause__ or exc).__name__}: {exc.__cause__ or exc}"[:160]
    return f"error {type(exc).__name__}", str(exc)[:160]


def retry_after_header(exc: Exception) -> str | None:
    """The Retry-After header of an HTTP error answer, if the server sent one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers.get("retry-after") if headers is not None else None


def longest_refused(samples: list[tuple[float, bool]]) -> float:
    """Longest run of refused connects: first refused sample to the next accepted one (or the last sample)."""
    longest, opened = 0.0, None
    for at, accepted in samples:
        if not accepted and opened is None:
            opened = at
        elif accepted and opened is not None:
            longest, opened = max(longest, at - opened), None
    if opened is not None:
        longest = max(longest, samples[-1][0] - opened)
    return longest


@dataclass
class ChatLoad:
    """`rate` chat completions per second to `base_url` (an OpenAI-compatible /v1), until stopped or
    `max_duration` s, each bounded by `timeout`. At most rate * timeout requests can be in flight, so
    the thread pool is sized for that and the schedule never waits for the server (an open loop, as
    independent clients are); `max_in_flight` only guards against a mistaken configuration."""

    base_url: str
    api_key: str
    model: str
    rate: float = 4.0
    timeout: float = 60.0
    max_duration: float = 300.0
    max_in_flight: int = 512
    max_tokens: int = 8
    outcomes: list[Outcome] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _in_flight: threading.Semaphore | None = None
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None
    _client: object | None = None

    def start(self) -> ChatLoad:
        from openai import OpenAI

        self._client = OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=0)
        workers = min(self.max_in_flight, math.ceil(self.rate * self.timeout) + 8)
        self._in_flight = threading.Semaphore(workers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chat-load")
        self._thread = threading.Thread(target=self._schedule, name="chat-load", daemon=True)
        self._thread.start()
        return self

    def _schedule(self) -> None:
        began, index = time.monotonic(), 0
        while not self._stop.is_set():
            at = began + index / self.rate
            if at - began > self.max_duration:
                break
            if self._stop.wait(max(0.0, at - time.monotonic())):
                break
            if self._in_flight.acquire(blocking=False):
                self._pool.submit(self._one, index)
            else:
                now = time.monotonic()
                self._record(Outcome(now, now, "not sent: too many in flight"))
            index += 1

    def _one(self, index: int) -> None:
        sent = time.monotonic()
        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": f"Count to {index % 10}."}],
                max_tokens=self.max_tokens, temperature=0)
            tokens = response.usage.completion_tokens if response.usage else 0
            cause, detail = (OK, "") if tokens and response.choices else (EMPTY, str(response)[:160])
        except Exception as exc:  # noqa: BLE001 - every failure is recorded by cause; none may end the load thread
            cause, detail = classify(exc)
            retry_after = retry_after_header(exc)
        else:
            retry_after = None
        finally:
            self._in_flight.release()
        self._record(Outcome(sent, time.monotonic(), cause, detail, retry_after))

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def stop(self) -> list[Outcome]:
        """Send no more; wait for those in flight (each ends within its timeout); return every outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
        return self.snapshot()


def succeeding_again(outcomes: list[Outcome], after: float, streak: int) -> bool:
    """The last `streak` requests sent after `after`, in send order, all succeeded."""
    later = sorted((o for o in outcomes if o.sent >= after), key=lambda o: o.sent)
    return len(later) >= streak and all(o.ok for o in later[-streak:])


@dataclass(frozen=True)
class CrashSummary:
    """A load around a kill, from the client's side. Times are seconds after the kill."""

    sent: int
    ok: int
    failed: int
    causes: dict[str, int]
    failed_in_flight: int  # sent before the kill, ended after it
    failed_sent_after: int  # sent after the kill
    failed_before: int  # ended before the kill: the deployment was not healthy to begin with
    longest_refused_s: float  # the public port refusing connections
    longest_without_success_s: float  # longest stretch in which no request got a successful answer
    first_failure_s: float | None  # the first failed answer (its end)
    answered_again_s: float | None  # the first successful answer to a request sent after the kill (its end)
    all_succeed_from_s: float | None  # every request sent from then on succeeded (the send time after the last failure)
    slowest_success_after_kill_s: float | None  # longest latency of a successful request sent after the kill
    worker_ready_s: float | None  # the restarted worker passed its gate
    details: tuple[str, ...] = ()

    @property
    def beyond_ready_s(self) -> float | None:
        """From the restarted worker passing its gate to the first successful answer (the target: <= 5 s)."""
        if self.answered_again_s is None or self.worker_ready_s is None:
            return None
        return self.answered_again_s - self.worker_ready_s


def _longest_without_success(ordered: list[Outcome]) -> float:
    """Longest gap between consecutive successful answers (by end time), the load's start and end included."""
    if not ordered:
        return 0.0
    marks = [ordered[0].sent, *sorted(o.ended for o in ordered if o.ok), max(o.ended for o in ordered)]
    return max(b - a for a, b in itertools.pairwise(marks)) if len(marks) > 1 else 0.0


def summarize(outcomes: list[Outcome], killed_at: float, ready_at: float | None,
              samples: list[tuple[float, bool]]) -> CrashSummary:
    """Count a run around a kill at `killed_at`; `ready_at` is when the restarted worker passed its gate."""
    ordered = sorted(outcomes, key=lambda o: o.sent)
    failures = [o for o in ordered if not o.ok]
    if not failures:
        all_from: float | None = 0.0
    else:
        after = [o for o in ordered if o.ok and o.sent > failures[-1].sent]
        all_from = max(0.0, after[0].sent - killed_at) if after else None
    later_ok = [o for o in ordered if o.ok and o.sent >= killed_at]
    return CrashSummary(
        sent=len(ordered),
        ok=len(ordered) - len(failures),
        failed=len(failures),
        causes=dict(Counter(o.cause for o in failures)),
        failed_in_flight=sum(1 for o in failures if o.sent < killed_at <= o.ended),
        failed_sent_after=sum(1 for o in failures if o.sent >= killed_at),
        failed_before=sum(1 for o in failures if o.ended < killed_at),
        longest_refused_s=longest_refused(samples),
        longest_without_success_s=_longest_without_success(ordered),
        first_failure_s=min(o.ended for o in failures) - killed_at if failures else None,
        answered_again_s=min(o.ended for o in later_ok) - killed_at if later_ok else None,
        all_succeed_from_s=all_from,
        slowest_success_after_kill_s=max(o.ended - o.sent for o in later_ok) if later_ok else None,
        worker_ready_s=None if ready_at is None else ready_at - killed_at,
        details=tuple(sorted({f"{o.cause}: {o.detail}" for o in failures if o.detail})[:8]),
    )


def as_report(summary: CrashSummary) -> dict:
    def r(value):
        return None if value is None else round(value, 2)

    return {
        "sent": summary.sent, "ok": summary.ok, "failed": summary.failed, "failed_by_cause": summary.causes,
        "failed_in_flight_at_kill": summary.failed_in_flight, "failed_sent_after_kill": summary.failed_sent_after,
        "failed_before_kill": summary.failed_before, "longest_refused_s": r(summary.longest_refused_s),
        "longest_without_a_successful_answer_s": r(summary.longest_without_success_s),
        "first_failure_after_kill_s": r(summary.first_failure_s),
        "worker_ready_again_after_kill_s": r(summary.worker_ready_s),
        "first_successful_answer_after_kill_s": r(summary.answered_again_s),
        "successful_answer_after_worker_ready_s": r(summary.beyond_ready_s),
        "all_requests_sent_from_s_after_kill_succeeded": r(summary.all_succeed_from_s),
        "slowest_success_sent_after_kill_s": r(summary.slowest_success_after_kill_s),
        "failure_details": list(summary.details),
    }


def timeline(outcomes: list[Outcome], killed_at: float) -> list[list]:
    """Every request as [sent, ended] seconds after the kill and its cause, in send order (for the record)."""
    return [[round(o.sent - killed_at, 2), round(o.ended - killed_at, 2), o.cause]
            for o in sorted(outcomes, key=lambda o: o.sent)]
