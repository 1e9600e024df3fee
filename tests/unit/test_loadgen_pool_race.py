"""The load generator survives the connection-pool race that failed the fault tier once (CI at b03a4f5:
a request sent after `kill -9` of the prefill failed with "ReadError: [Errno 9] Bad file descriptor",
the server saw nothing).

The race (httpcore 1.0.9, encode/httpcore#1110): a pool pass hands an idle keep-alive connection to a
queued request, but the connection stays IDLE until that request's thread gets to run. A pass of another
thread sharing the pool can meanwhile evict it (keep-alive lapsed, or "surplus": with more than
max_keepalive_connections in the pool, which the stalled requests after a worker's death cause) and close
it outside the pool's lock, after the request started on it. The request's socket is then closed under it:
EBADF on its read. In CI the windows are microseconds wide; here a scheduler makes the losing interleaving
happen every time, and only by delaying threads (and letting the keep-alive clock run on while one waits),
never by changing what the pool decides:

1. The first request that gets a reused connection waits, as a descheduled thread would, until its
   connection's keep-alive lapsed and another thread's pass evicted the connection (bounded).
2. A pass that closes a connection a pending request was handed waits until that request started on it
   (bounded), and the server holds its answers until that close happened (bounded).

With one pool shared by the load's threads that request fails every time: as in CI when the close comes
before its read ("ReadError: [Errno 9] Bad file descriptor"), or it waits out its read timeout when the
close comes while it waits for the answer (the poll() on the closed fd is not woken, as #1110 reports).
With a pool per thread no other thread ever sees the connection, the bounded waits lapse and every
request succeeds. The scheduler reaches into httpcore 1.0.9's pool internals; a change there breaks this
test loudly (AttributeError), it cannot make it pass by itself.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpcore._sync.connection_pool as pool_module
import httpcore._sync.http11 as http11_module
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from loadgen import OK, Load

BOUND = 0.5  # the most any injected wait lasts, seconds
ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}).encode()


class _Clock:
    """httpcore's keep-alive clock, able to run ahead (a thread that slept past the keep-alive)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


class _Scheduler:
    def __init__(self) -> None:
        self.armed = True
        self.handed: object | None = None  # the connection step 1 holds its request on
        self.closed = threading.Event()
        self.hold_answers_until = 0.0  # time.monotonic()


def _wait_until(condition, bound: float = BOUND) -> bool:
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _state(connection) -> str:
    inner = getattr(connection, "_connection", None)
    return inner._state.name if inner is not None else "NEW"


@pytest.fixture
def scheduler(monkeypatch) -> _Scheduler:
    sched = _Scheduler()
    clock = _Clock()
    monkeypatch.setattr(http11_module, "time", clock)
    wait_for_connection = pool_module.PoolRequest.wait_for_connection
    close_connections = pool_module.ConnectionPool._close_connections
    handle_request = pool_module.ConnectionPool.handle_request

    def remember_pool(self, request):
        request.extensions = {**request.extensions, "pdserve_pool": self}
        return handle_request(self, request)

    def slow_to_start(self, timeout=None):
        connection = wait_for_connection(self, timeout)
        reused = _state(connection) == "IDLE" and connection._connection._request_count > 0
        if sched.armed and reused:
            sched.armed = False
            sched.handed = connection
            sched.hold_answers_until = time.monotonic() + 2 * BOUND
            clock.ahead += 3600.0  # this thread slept past every keep-alive
            pool = self.request.extensions["pdserve_pool"]
            _wait_until(lambda: connection not in pool.connections)  # another thread's pass evicted it
        return connection

    def slow_to_close(self, closing):
        for connection in closing:
            if connection is sched.handed:
                _wait_until(lambda connection=connection: _state(connection) != "IDLE")  # its request started on it
        close_connections(self, closing)
        if any(connection is sched.handed for connection in closing):
            sched.closed.set()

    monkeypatch.setattr(pool_module.ConnectionPool, "handle_request", remember_pool)
    monkeypatch.setattr(pool_module.PoolRequest, "wait_for_connection", slow_to_start)
    monkeypatch.setattr(pool_module.ConnectionPool, "_close_connections", slow_to_close)
    return sched


@pytest.fixture
def server(scheduler) -> Iterator[str]:
    class Chat(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the router serves

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            scheduler.closed.wait(max(0.0, scheduler.hold_answers_until - time.monotonic()))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:
            pass  # a client closing its keep-alive connection is no news here

    httpd = Server(("127.0.0.1", 0), Chat)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="chat-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_no_request_is_cut_off_by_another_threads_pool_pass(scheduler, server):
    load = Load(server, rate=10, duration=1.0, timeout=3).start()
    load.wait()
    assert not scheduler.armed, "no request reused a keep-alive connection: the scheduler never ran"
    failed = [f"{o.cause}: {o.detail}" for o in load.outcomes if o.cause != OK]
    assert len(load.outcomes) == 10 and failed == [], failed
