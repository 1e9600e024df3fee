"""pdserve.probes.http against misbehaving servers: the deadline holds for the whole exchange, the size bound
after decompression, no redirect is followed, and odd JSON is named, never raised."""

from __future__ import annotations

import time
import tracemalloc

import httpx
import pytest

from pdserve.probes import http
from tests.fixtures import misbehaving_server as ms

DEADLINE = 1.0
SLACK = 0.5  # thread wake-ups and the close of the connection on two busy cores
MiB = 1024 * 1024


@pytest.fixture
def client():
    with http.client(DEADLINE) as bounded:
        yield bounded


def _timed_get(client, url: str) -> tuple[float, object]:
    began = time.monotonic()
    seen = http.get(client, url)
    return time.monotonic() - began, seen


@pytest.mark.parametrize("behaviour", [ms.slow_headers, ms.slow_body, ms.endless_body],
                         ids=["slow headers", "slow body", "endless body"])
def test_the_deadline_bounds_the_whole_exchange(client, behaviour):
    # Each byte arrives well within httpx's per-read timeout; only a deadline on the exchange ends these.
    with ms.serving({"/server_info": behaviour}) as server:
        took, seen = _timed_get(client, f"{server.url}/server_info")
    assert took <= DEADLINE + SLACK, f"took {took:.2f} s"
    assert seen.status is None and f"no complete answer within {DEADLINE:g} s (the whole exchange)" in seen.error


def test_the_deadline_is_per_request_and_never_past_not_after():
    with ms.serving({"/slow": ms.slow_body, "/ok": ms.answer(200, {"a": 1})}) as server:
        with http.client(0.5) as each:
            assert http.get(each, f"{server.url}/slow").status is None
            assert http.get(each, f"{server.url}/ok").body == {"a": 1}  # a fresh deadline for the next request
        with http.client(10, not_after=time.monotonic() + 0.5) as capped:
            took, seen = _timed_get(capped, f"{server.url}/slow")
    assert took <= 0.5 + SLACK and "within 0.5 s" in seen.error


def _peak(call) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result = call()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_a_256_mib_body_is_cut_at_the_json_bound(client):
    with ms.serving({"/server_info": ms.huge_body(256 * MiB)}) as server:
        peak, seen = _peak(lambda: http.get(client, f"{server.url}/server_info"))
    assert seen.status is None and f"answer larger than {http.JSON_MAX_BYTES} bytes" in seen.error
    assert peak < 3 * http.JSON_MAX_BYTES, f"peak {peak / MiB:.1f} MiB"


def test_a_gzip_bomb_is_cut_after_decompression(client):
    ms.bomb_bytes(256 * MiB)  # made before measuring: the server's compression is not the client's memory
    with ms.serving({"/server_info": ms.gzip_bomb(256 * MiB)}) as server:
        peak, seen = _peak(lambda: http.get(client, f"{server.url}/server_info"))
    assert seen.status is None and f"answer larger than {http.JSON_MAX_BYTES} bytes" in seen.error
    assert peak < 3 * http.JSON_MAX_BYTES, f"peak {peak / MiB:.1f} MiB"


def test_the_transport_bounds_every_body_after_decompression():
    """The bound is the transport's, so it holds for a caller that reads with no bound of its own (openai)."""
    ms.bomb_bytes(64 * MiB)
    routes = {"/gzip": ms.gzip_bomb(64 * MiB),
              "/deflate": ms.answer(200, _deflated(64 * MiB), {"Content-Encoding": "deflate"})}
    with ms.serving(routes) as server, http.client(5, max_bytes=MiB) as small:
        for path in routes:
            tracemalloc.start()
            try:
                with pytest.raises(httpx.TransportError, match=f"answer larger than {MiB} bytes after decompression"):
                    small.get(f"{server.url}{path}")  # httpx reads the whole body: only the transport stops it
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 4 * MiB, f"{path}: peak {peak / MiB:.1f} MiB"


def _deflated(size: int) -> bytes:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS)
    return b"".join([packer.compress(b" " * MiB) for _ in range(size // MiB)] + [packer.flush()])


def test_compressed_answers_within_the_bound_are_read():
    with ms.serving({"/gz": ms.gzipped({"tp_size": 4})}) as server, http.client(5) as bounded:
        assert http.get(bounded, f"{server.url}/gz").body == {"tp_size": 4}


def test_an_encoding_without_a_bound_is_refused_by_name(client):
    with ms.serving({"/br": ms.gzip_bomb(MiB, encoding="br")}) as server:
        seen = http.get(client, f"{server.url}/br")
    assert seen.status is None and "Content-Encoding 'br'" in seen.error


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_an_answer_never_a_request_elsewhere(client, status):
    with ms.serving({"*": ms.answer(200, {"healthy_workers": 2, "total_workers": 2})}) as elsewhere:
        target = f"{elsewhere.url}/readiness"
        with ms.serving({"/readiness": ms.redirect(status, target)}) as router:
            seen = http.get(client, f"{router.url}/readiness")
            # Even a caller that asks the client to follow is not obeyed.
            asked = client.get(f"{router.url}/readiness", follow_redirects=True)
    assert elsewhere.requests == []
    assert asked.status_code == status
    assert seen.status == status and not seen.ok and seen.location == target
    assert f"a redirect to {target!r}, not followed" in seen.describe()


@pytest.mark.parametrize(("body", "named"), [
    (ms.DEEP, "nested deeper than 32 levels"),
    ('{"a": ' + ms.HUGE_INT + "}", "an integer of 400 digits"),
    ('{"a": ' + ms.PYTHON_REFUSED_INT + "}", "an integer of 5000 digits"),
    ("{'a': 1}", "not JSON"),
    (b'{"a": "\xff\xfe"}', "not UTF-8"),
    ('{"a": NaN}', "NaN is no JSON number"),
    ('[-Infinity]', "-Infinity is no JSON number"),
], ids=["deep", "400 digits", "5000 digits", "not JSON", "invalid UTF-8", "NaN", "-Infinity"])
def test_json_the_client_cannot_read_is_named_not_raised(client, body, named):
    with ms.serving({"/server_info": ms.answer(200, body)}) as server:
        seen = http.get(client, f"{server.url}/server_info")
    assert seen.status == 200 and not seen.ok and seen.body is None
    assert named in seen.error and named in seen.describe()


def test_a_lone_surrogate_is_carried_as_read(client):
    # Valid JSON (an escape), not valid Unicode: the value is kept; the report makes it printable.
    with ms.serving({"/server_info": ms.answer(200, '{"version": "\\ud800"}')}) as server:
        assert http.get(client, f"{server.url}/server_info").body == {"version": "\ud800"}


def test_a_refused_connection_is_named(client):
    with ms.serving({}) as server:
        url = server.url
    seen = http.get(client, f"{url}/health")
    assert seen.status is None and "ConnectError" in seen.error
