"""The warm start under real systemd, with the real smg router: a restarted prefill's unit leaves the router
(ExecStartPre=) and its gate hands it back only after its own KV hand-off (ExecStartPost=), so the first
request that reaches the new prefill process is the gate's. The router restarted in the middle of that
(its process gone, so nothing to take the prefill out of, and a fresh one that would register the prefill
from its flags) is held by After= until the prefill's start has ended.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from tests.integration.systemd.container import wait_for
from tests.integration.systemd.lab import MODEL

pytestmark = pytest.mark.integration

STALL_S = 3
KNOBS = {"PDSERVE_STANDIN_STARTUP_DELAY": "6", "PDSERVE_STANDIN_FIRST_TRANSFER_STALL": str(STALL_S)}
ARRIVED = re.compile(r"PD request arrived: (\S+) rid=(\S+)")


def chats_until(url: str, stop: threading.Event, results: list[tuple[int | None, float]]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            began = time.monotonic()
            try:
                status: int | None = client.post(f"{url}/v1/chat/completions", json=body).status_code
            except httpx.HTTPError:
                status = None
            results.append((status, time.monotonic() - began))
            time.sleep(0.1)


def arrivals(lab, invocation: str) -> list[tuple[str, str]]:
    text = lab.container.run(["journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}"],
                             check=False).stdout
    return ARRIVED.findall(text)


@pytest.mark.parametrize("restart_router", [False, True], ids=["router-up", "router-restarted-meanwhile"])
def test_a_restarted_prefill_takes_no_client_request_before_its_own_hand_off(lab, capsys, restart_router):
    lab.install(lab.variant(prefill_env=KNOBS))
    done = lab.container.run(["systemctl", "start", lab.unit("router")], timeout=200, check=False)
    assert done.returncode == 0, done.stderr + lab.diagnostics()
    lab.wait_serving()
    prefill, router = lab.unit("prefill"), lab.unit("router")
    before = lab.states()[prefill]
    stop, results = threading.Event(), []
    load = threading.Thread(target=chats_until, args=(lab.url("router"), stop, results), daemon=True)
    load.start()
    try:
        lab.container.run(["kill", "-KILL", str(before.main_pid)])

        def starting():
            state = lab.states()[prefill]
            return state if state.main_pid not in (0, before.main_pid) and state.active_state == "activating" else None

        again = wait_for(starting, 60, "the prefill to be started again")
        if restart_router:
            lab.container.run(["systemctl", "restart", "--no-block", router])
        wait_for(lambda: lab.states()[prefill].active_state == "active", 120, "the prefill to be ready again")
        wait_for(lambda: lab.states()[router].active_state == "active", 120, "the router to be active again")
        served_from = len(results)
        wait_for(lambda: sum(1 for s, _ in results[served_from:] if s == 200) >= 5, 60, "chats served again")
    finally:
        stop.set()
        load.join(timeout=60)
    states = lab.states()
    seen = arrivals(lab, states[prefill].invocation_id)
    with capsys.disabled():
        print(f"\nrouter {'restarted' if restart_router else 'up'}: first arrivals at the new prefill "
              f"{seen[:3]}; slowest chat {max(t for s, t in results if s == 200):.2f} s; prefill active at "
              f"{states[prefill].active_enter_us / 1e6:.1f}, router at {states[router].active_enter_us / 1e6:.1f}")
    assert again.invocation_id == states[prefill].invocation_id
    assert seen and seen[0][0] == "/generate" and seen[0][1].startswith("pdserve-warmup-"), seen[:3]
    assert all(path == "/v1/chat/completions" for path, _ in seen[1:]), seen
    assert max(t for s, t in results if s == 200) < STALL_S - 0.5, results
    if restart_router:
        # After= held the router's new start until the prefill's start (its gate included) had ended.
        assert states[router].active_enter_us >= states[prefill].active_enter_us
