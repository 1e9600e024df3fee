"""The transport under every HTTP request pdserve sends: one deadline per exchange, one size bound per body.

httpx's timeouts bound each socket operation, so a server that sends a byte a second, or a stream that
never ends, holds a request for as long as it likes. Here every request gets a deadline when it starts
(the client's seconds, never later than its `not_after`), and the network streams under it clamp every
connect, read and write to the time left before that deadline: a drip-feeding server meets it after the
stated seconds, whether it drips the headers, the body or a stream's chunks. The deadline travels in a
thread-local set around each step of the exchange, because httpcore reuses one network stream for several
requests.

Bodies are bounded after decompression: the transport asks for `identity`, decodes gzip and deflate itself
in steps of at most DECODE_STEP bytes (so a bomb stops at the bound, never expands in memory), and refuses
any other encoding, naming it. httpx then sees a plain body and decodes nothing. (Redirects: the client
in pdserve.probes.http never follows one.)
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

DECODE_STEP = 64 * 1024
WRITE_STEP = 4096  # each send is clamped on its own; a request body here is a few KiB

_local = threading.local()


class AnswerTooLarge(httpx.TransportError):
    """The body, after decompression, passed the client's size bound."""


class DeadlinePassed(httpx.ReadTimeout):
    """The exchange did not complete before its deadline."""


class RefusedEncoding(httpx.DecodingError):
    """A Content-Encoding pdserve does not decode with a bound."""


@contextlib.contextmanager
def _within(deadline: float) -> Iterator[None]:
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = previous


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """The socket timeout for the next step: the step's own timeout, clamped to the time left."""
    deadline: float | None = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_STEP):
            self._inner.write(buffer[start:start + WRITE_STEP], _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        # Name resolution inside is not bounded by the timeout: deployments name hosts by address.
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                               socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@contextlib.contextmanager
def _as_httpx(deadline: float, seconds: float) -> Iterator[None]:
    """httpcore's exceptions as the httpx ones of the same name, which every caller (openai too) catches;
    a timeout at the deadline says it was the whole exchange's."""
    try:
        yield
    except httpcore.TimeoutException as exc:
        if time.monotonic() >= deadline - 0.01:
            raise DeadlinePassed(f"no complete answer within {seconds:g} s (the whole exchange)") from exc
        raise getattr(httpx, type(exc).__name__, httpx.TimeoutException)(str(exc) or type(exc).__name__) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, httpcore.ProxyError) as exc:
        raise getattr(httpx, type(exc).__name__, httpx.TransportError)(str(exc) or type(exc).__name__) from exc


class _Decoder:
    """Identity, gzip or deflate, in bounded steps, counting what comes out."""

    def __init__(self, encoding: str, limit: int, url: str) -> None:
        self.limit, self.url, self.size = limit, url, 0
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
        if encoding not in ("", "identity") and wbits is None:
            raise RefusedEncoding(f"{url} answered with Content-Encoding {encoding!r}, which pdserve does not decode "
                                  f"(it asks for identity and bounds only gzip and deflate)")
        self._zlib = zlib.decompressobj(wbits) if wbits else None

    def _count(self, data: bytes) -> bytes:
        self.size += len(data)
        if self.size > self.limit:
            raise AnswerTooLarge(f"answer larger than {self.limit} bytes after decompression")
        return data

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._zlib is None:
            yield self._count(data)
            return
        try:
            while data:
                yield self._count(self._zlib.decompress(data, DECODE_STEP))
                data = self._zlib.unconsumed_tail
        except zlib.error as exc:
            raise httpx.DecodingError(f"{self.url}: the compressed body is not valid ({exc})") from None

    def flush(self) -> bytes:
        return self._count(self._zlib.flush(DECODE_STEP)) if self._zlib else b""


class _Body(httpx.SyncByteStream):
    def __init__(self, raw: Iterable[bytes], deadline: float, seconds: float, decoder: _Decoder) -> None:
        self._raw, self._deadline, self._seconds, self._decoder = raw, deadline, seconds, decoder

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._raw)
        while True:
            with _within(self._deadline), _as_httpx(self._deadline, self._seconds):
                if time.monotonic() >= self._deadline:  # a fast endless body never blocks, so look here too
                    raise httpcore.ReadTimeout("the request's deadline passed")
                chunk = next(chunks, None)
            if chunk is None:
                break
            yield from self._decoder.feed(chunk)
        tail = self._decoder.flush()
        if tail:
            yield tail

    def close(self) -> None:
        with _as_httpx(self._deadline, self._seconds):
            closer = getattr(self._raw, "close", None)
            if closer:
                closer()


class BoundedTransport(httpx.BaseTransport):
    """An httpx transport with a whole-exchange deadline and a decoded size bound on each response."""

    def __init__(self, seconds: float, max_bytes: int, not_after: float | None = None) -> None:
        self.seconds, self.max_bytes, self.not_after = seconds, max_bytes, not_after
        self._pool = httpcore.ConnectionPool(ssl_context=ssl.create_default_context(), network_backend=_Backend(),
                                             max_connections=20, retries=0)

    def deadline(self) -> float:
        deadline = time.monotonic() + self.seconds
        return deadline if self.not_after is None else min(deadline, self.not_after)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = self.deadline()
        span = round(max(0.0, deadline - time.monotonic()), 1)  # what the error says: not_after may cut it
        url = str(request.url)
        raw = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        with _within(deadline), _as_httpx(deadline, span):
            answer = self._pool.handle_request(raw)
        headers = httpx.Headers(answer.headers)
        encoding = headers.get("content-encoding", "").strip().lower()
        try:
            decoder = _Decoder(encoding, self.max_bytes, url)
        except RefusedEncoding:
            answer.close()
            raise
        # httpx must not decode again, nor check a length that was the compressed one.
        for name in ("content-encoding", "content-length") if encoding not in ("", "identity") else ():
            del headers[name]
        answer_stream = answer.stream
        if not isinstance(answer_stream, Iterable):  # httpcore's sync pool answers with an iterable stream
            raise TypeError(f"an async stream from a sync connection pool: {type(answer_stream).__name__}")
        return httpx.Response(answer.status, headers=headers, stream=_Body(answer_stream, deadline, span, decoder),
                              extensions=answer.extensions, request=request)

    def close(self) -> None:
        self._pool.close()
