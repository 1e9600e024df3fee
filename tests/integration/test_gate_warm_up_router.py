"""The warm-up gate against the REAL smg 1.13.0 router and two stand-in SGLang workers.

A restarted prefill's first KV transfer stalls (SGLang: ~7 s on one H200; the stand-in's knob models it,
3 s here). The control shows what smg does alone: it takes the restarted prefill back on its own health
check and a client's request pays the stall. With the unit's two steps (`pdserve leave-routers prefill`
before the start, `pdserve wait-ready prefill --warm-up` after it), the first request that reaches the
restarted prefill is the gate's own hand-off, and no client request pays the stall. Also: a peer that is
down keeps the gate waiting until its deadline and it says why; a router that is down is no obstacle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from pdserve.schema.derived import API_KEY_CREDENTIAL, MISSING_KEY_STAND_IN

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from pd_cluster import SERVED, PDCluster, wait_until, write_deployment

pytestmark = pytest.mark.integration

STALL_S = 3.0
STALL = {"PDSERVE_STANDIN_FIRST_TRANSFER_STALL": str(STALL_S)}
ARRIVED = re.compile(r"PD request arrived: (\S+) rid=(\S+) bootstrap_room=")


def pdserve(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdserve.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=dict(os.environ, **(env or {})))


@dataclass
class Load:
    """Chats through the router, one after another, until stopped: (sent at, status, seconds) each."""

    url: str
    results: list[tuple[float, int | None, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        body = {"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    status: int | None = client.post(f"{self.url}/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    status = None
                self.results.append((sent, status, time.monotonic() - sent))
                time.sleep(0.05)

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def served_after(self, moment: float) -> list[float]:
        return [seconds for sent, status, seconds in self.results if sent >= moment and status == 200]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("warm")
    c = PDCluster(write_deployment(workdir, router={"health_failure_threshold": 1}), workdir)
    try:
        c.start_worker("prefill")
        c.start_worker("decode")
        c.wait_workers()
        start_smg(c)
        yield c
    finally:
        c.stop()


def start_smg(c: PDCluster) -> None:
    c.start_router()  # smg 1.13.0, with the argv pdserve renders
    c.wait_router_ready()


def router_lists(c: PDCluster, role: str) -> bool:
    answer = httpx.get(f"{c.url('router')}/workers", timeout=5).json()
    return any(w["url"] == c.url(role) and w["worker_type"] == role for w in answer["workers"])


def router_may_route_to(c: PDCluster, role: str) -> bool:
    """Listed and not draining: smg drains a removed worker it still held Ready for 5 s before it drops it."""
    answer = httpx.get(f"{c.url('router')}/workers", timeout=5).json()
    return any(w["url"] == c.url(role) and w["worker_type"] == role and w.get("status") != "draining"
               for w in answer["workers"])


def arrivals_since(c: PDCluster, role: str, offset: int) -> list[tuple[str, str]]:
    text = c.log(role).read_text(errors="replace")[offset:]
    return ARRIVED.findall(text)


def restart_prefill(c: PDCluster, knobs: dict[str, str] = STALL) -> int:
    """Kill the prefill (as a crash would), start it again with the first-transfer stall; the log offset
    from which the new process writes."""
    c.procs.pop("prefill").kill()
    offset = c.log("prefill").stat().st_size
    c.start_worker("prefill", knobs)
    return offset


def test_control_smg_alone_takes_the_prefill_back_and_a_client_pays_the_stall(cluster, capsys):
    c = cluster
    c.wait_router_ready(60)
    with Load(c.url("router")) as load:
        offset = restart_prefill(c)
        restarted = time.monotonic()
        assert wait_until(lambda: len(load.served_after(restarted)) >= 3, 90), c.logs("router")
    first = arrivals_since(c, "prefill", offset)[0]
    with capsys.disabled():
        print(f"\n--- without the gate: first arrival {first}; slowest chat {max(load.served_after(restarted)):.2f} s")
    assert first[0] == "/v1/chat/completions", first  # a client's request was the restarted prefill's first
    assert max(load.served_after(restarted)) >= STALL_S - 0.2  # and it paid the stall


def test_the_restarted_prefill_gets_no_client_traffic_until_the_warm_up_went_through(cluster, capsys):
    c = cluster
    c.wait_router_ready(60)
    with Load(c.url("router")) as load:
        c.procs["prefill"].kill()
        # The unit's ExecStartPre=: out of the router before the new process starts.
        left = pdserve("leave-routers", "prefill", "-c", str(c.config))
        assert left.returncode == 0, left.stderr
        assert "removed prefill" in left.stderr, left.stderr
        assert not router_may_route_to(c, "prefill")
        c.procs.pop("prefill")
        offset = c.log("prefill").stat().st_size
        c.start_worker("prefill", STALL)
        began = time.monotonic()
        # The unit's ExecStartPost=, with the new process as its main process.
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "120", "--interval", "0.5",
                       "--warm-up", env={"MAINPID": str(c.procs["prefill"].pid)})
        gated = time.monotonic()
        assert gate.returncode == 0, gate.stderr + c.logs("prefill")
        assert wait_until(lambda: len(load.served_after(gated)) >= 5, 60), c.logs("router")
    arrivals = arrivals_since(c, "prefill", offset)
    assert arrivals[0][0] == "/generate" and arrivals[0][1].startswith("pdserve-warmup-"), arrivals[:3]
    assert all(path == "/v1/chat/completions" for path, _ in arrivals[1:]), arrivals
    assert "went through in" in gate.stderr and "routes to prefill again" in gate.stderr, gate.stderr
    # The gate's hand-off paid the stall; no client did.
    assert re.search(r"went through in ([3-9]|\d\d)\.\d s", gate.stderr), gate.stderr
    served = load.served_after(began)
    with capsys.disabled():
        print(f"\n--- the gate's journal lines\n{gate.stderr}--- {len(served)} chats served after the restart, "
              f"slowest {max(served or [0]):.2f} s; first arrivals at the restarted prefill: {arrivals[:3]}")
    assert served and max(served) < STALL_S - 0.5, served
    assert router_lists(c, "prefill")


def test_a_peer_that_is_down_is_waited_for_then_the_server_goes_back_unwarmed_and_says_so(cluster):
    c = cluster
    c.stop_role("decode")
    try:
        began = time.monotonic()
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "60", "--interval", "0.5",
                       "--warm-up", "--peer-wait", "2")
        assert gate.returncode == 0, gate.stderr
        assert 2 <= time.monotonic() - began < 30
        assert "peer decode: " in gate.stderr and "unreachable" in gate.stderr, gate.stderr
        assert "no peer was ready within 2 s, so prefill goes back to the routers unwarmed" in gate.stderr
        assert router_lists(c, "prefill")
    finally:
        c.start_worker("decode")
        c.wait_workers()


def test_a_peer_whose_hand_off_fails_fails_the_gate_at_its_deadline(cluster):
    c = cluster
    c.set_faults("decode", faults=["kv_transfer_fails"])
    try:
        began = time.monotonic()
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "4", "--interval", "0.5",
                       "--warm-up")
        assert gate.returncode == 1, gate.stderr
        assert time.monotonic() - began < 30
        assert "no KV hand-off went through prefill in time" in gate.stderr, gate.stderr
        assert "decode decode" in gate.stderr and "answered 500" in gate.stderr and "KV transfer failed" in gate.stderr
    finally:
        c.reset_faults()


def test_a_stalled_hand_off_is_given_up_after_the_hand_off_timeout_and_the_next_goes_through(cluster):
    """The restarted prefill's first transfer stalls 30 s: the gate's first hand-off gives up after
    --handoff-timeout (naming the leg that did not answer) instead of waiting on it, and a later one passes."""
    c = cluster
    restart_prefill(c, {"PDSERVE_STANDIN_FIRST_TRANSFER_STALL": "30"})
    began = time.monotonic()
    gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "60", "--interval", "0.5",
                   "--warm-up", "--handoff-timeout", "2")
    took = time.monotonic() - began
    assert gate.returncode == 0, gate.stderr
    assert re.search(r"decode decode http://\S+ no answer \((DeadlinePassed|ReadTimeout)", gate.stderr), gate.stderr
    assert took < 25, gate.stderr  # far less than the 30 s stall


def test_a_router_that_is_down_neither_blocks_leaving_nor_the_hand_back(cluster):
    c = cluster
    c.stop_role("router")
    try:
        left = pdserve("leave-routers", "prefill", "-c", str(c.config), "--timeout", "3")
        assert left.returncode == 0 and "unreachable" in left.stderr, left.stderr
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "60", "--interval", "0.5",
                       "--warm-up")
        assert gate.returncode == 0, gate.stderr
        assert "registers prefill from its own flags" in gate.stderr, gate.stderr
    finally:
        start_smg(c)


def test_a_keyed_router_is_managed_with_its_key(tmp_path, visible_tmp_path):
    """smg's worker API answers 401 without the router's key; the membership steps read it as every pdserve
    command does ($CREDENTIALS_DIRECTORY, else the file), and with it take the prefill out and back."""
    key_file = visible_tmp_path / "router.key"
    key_file.write_text("warm-up-test-key\n")
    c = PDCluster(write_deployment(tmp_path, api_key_file=str(key_file)), tmp_path)
    try:
        c.start_worker("prefill")
        c.start_worker("decode")
        c.wait_workers()
        start_smg(c)
        assert httpx.get(f"{c.url('router')}/workers", timeout=5).status_code == 401
        # A host without the key file: its unit passes the stand-in; the server stays in, and the gate says why.
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / API_KEY_CREDENTIAL).write_text(MISSING_KEY_STAND_IN)
        kept = pdserve("leave-routers", "prefill", "-c", str(c.config), env={"CREDENTIALS_DIRECTORY": str(creds)})
        assert kept.returncode == 0 and "was not on this host" in kept.stderr, kept.stderr
        assert "a router kept prefill" in kept.stderr, kept.stderr
        # The unit's credential, as systemd passes it: out and back in.
        (creds / API_KEY_CREDENTIAL).write_text("warm-up-test-key\n")
        left = pdserve("leave-routers", "prefill", "-c", str(c.config), env={"CREDENTIALS_DIRECTORY": str(creds)})
        assert left.returncode == 0 and "removed prefill" in left.stderr, left.stderr
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "60", "--interval", "0.5",
                       "--warm-up", env={"CREDENTIALS_DIRECTORY": str(creds)})
        assert gate.returncode == 0 and "routes to prefill again" in gate.stderr, gate.stderr
        # And from the file itself, as an operator's root shell reads it.
        left = pdserve("leave-routers", "prefill", "-c", str(c.config))
        assert left.returncode == 0 and "removed prefill" in left.stderr, left.stderr
        gate = pdserve("wait-ready", "prefill", "-c", str(c.config), "--timeout", "60", "--interval", "0.5",
                       "--warm-up")
        assert gate.returncode == 0 and "routes to prefill again" in gate.stderr, gate.stderr
    finally:
        c.stop()
