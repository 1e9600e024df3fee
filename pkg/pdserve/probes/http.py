"""pdserve's one HTTP client, and its bounded JSON read; never raises for network trouble or odd answers.

`client()` is what every command opens (verify, wait-ready, the cutover's smoke test, the readiness gates,
the openai client of the end-to-end checks): a deadline on the whole exchange and a size bound on every
body after decompression (pdserve.probes.transport), and no redirect followed, ever: a 3xx is an answer,
reported with its Location. `get()` reads a JSON endpoint into an HttpObs: the body parsed with a bound on
its size and its nesting, or the reason it could not be.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from pdserve.probes.observations import HttpObs
from pdserve.probes.transport import AnswerTooLarge, BoundedTransport, DeadlinePassed

MAX_BYTES = 16 * 1024 * 1024  # any body, after decompression: a chat answer of thousands of tokens is < 1 MiB
JSON_MAX_BYTES = 4 * 1024 * 1024  # SGLang's /server_info is ~20 KB; the router's /workers less
MAX_DEPTH = 32  # SGLang's and the router's answers nest 4 deep
MAX_DIGITS = 30  # an integer pdserve reads fits in 64 bits (20 digits); Python refuses > 4300 with ValueError


class BoundedClient(httpx.Client):
    """httpx's client that never follows a redirect, whatever a caller (openai) asks for."""

    def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        kwargs["follow_redirects"] = False
        return super().send(request, **kwargs)


def client(seconds: float, max_bytes: int = MAX_BYTES, not_after: float | None = None) -> BoundedClient:
    """A client whose every request completes within `seconds` (and before `not_after`, a time.monotonic()
    value, when given) and whose every body is at most `max_bytes` after decompression."""
    return BoundedClient(transport=BoundedTransport(seconds, max_bytes, not_after), timeout=seconds,
                         follow_redirects=False, headers={"Accept-Encoding": "identity"})


class NotJson(ValueError):
    """A body that is not JSON pdserve reads; the text says what it is."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise NotJson(f"an integer of {len(text.lstrip('-'))} digits ({text[:12]}...)")
    return int(text)


def _depth_within(value: object) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    raise NotJson(f"JSON nested deeper than {MAX_DEPTH} levels")
                stack.append((child, depth + 1))


def _not_a_number(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON (RFC 8259) does not have: a server sending them is
    # not speaking JSON, and the value would otherwise travel on into reports.
    raise NotJson(f"not JSON: {name} is no JSON number")


def parse_json(data: bytes) -> Any:
    """The JSON value of a body; NotJson naming what it is instead. Integers longer than MAX_DIGITS and
    nesting deeper than MAX_DEPTH are refused here, so no later step meets them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJson(f"not UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 4]!r})") from None
    try:
        value = json.loads(text, parse_int=_int, parse_constant=_not_a_number)
    except RecursionError:
        raise NotJson(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        if isinstance(exc, NotJson):
            raise
        raise NotJson(f"not JSON ({exc}): {text[:60]!r}") from None
    _depth_within(value)
    return value


def _problem(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def read(client: httpx.Client, method: str, url: str, max_bytes: int, seconds: float | None = None,
         **kwargs: Any) -> tuple[httpx.Response, bytes]:
    """(response, body) with the body read up to `max_bytes` (decoded) and, with `seconds`, only while
    bytes arrive in time; httpx.HTTPError for network trouble, a larger body or a late one. Any client works
    (tests pass httpx's MockTransport); pdserve's own also bounds each blocking read by its deadline."""
    began = time.monotonic()
    with client.stream(method, url, **kwargs) as response:
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise AnswerTooLarge(f"answer larger than {max_bytes} bytes after decompression")
            if seconds is not None and time.monotonic() - began > seconds:
                raise DeadlinePassed(f"answer not complete within {seconds:g} s")
    return response, bytes(body)


def get(client: httpx.Client, url: str, headers: dict[str, str] | None = None,
        max_bytes: int = JSON_MAX_BYTES) -> HttpObs:
    return exchange(client, "GET", url, headers=headers, max_bytes=max_bytes)


def exchange(client: httpx.Client, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
             max_bytes: int = JSON_MAX_BYTES) -> HttpObs:
    """One request (with `body` as JSON, when given) read as get() reads its answer: bounded, never raising."""
    try:
        extra = {} if body is None else {"json": body}
        response, data = read(client, method, url, max_bytes, headers=headers, **extra)
    except httpx.HTTPError as exc:
        return HttpObs(url, None, None, _problem(exc),
                       unreachable=isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)))
    if response.is_redirect:
        location = response.headers.get("location", "")
        return HttpObs(url, response.status_code, None, f"a redirect to {location!r}, not followed", location)
    if not data.strip():
        return HttpObs(url, response.status_code, None)  # SGLang's /health: 200 and no body
    try:
        return HttpObs(url, response.status_code, parse_json(data))
    except NotJson as exc:
        if response.status_code == 200 and "json" in response.headers.get("content-type", ""):
            return HttpObs(url, 200, None, f"the answer is {exc}")
        # A non-JSON error page or a plain-text answer (/metrics): its text, for the message that names it.
        return HttpObs(url, response.status_code, data.decode("utf-8", errors="replace"))
