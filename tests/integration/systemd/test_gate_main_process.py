"""Under real systemd: a worker that dies while its ExecStartPost= gate waits is restarted at once.

Without the gate watching $MAINPID, systemd keeps the unit in "activating (start-post)" until the gate's
own deadline (TimeoutStartSec - 10 s; 30 min for a worker by default) and only then restarts it. The
prefill here answers /health 503 for ten minutes, so its gate would wait its whole 290 s; it is killed
a few seconds into start-post and must leave start-post within a few seconds and be started again.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.systemd.container import wait_for

pytestmark = pytest.mark.integration

GATE_TIMEOUT_SEC = 300  # TimeoutStartSec=; the gate's own deadline is 10 s less
LEFT_WITHIN_S = 8.0  # the gate sees the exit at once; the rest is systemd's and the container's latency


def test_a_worker_killed_during_start_post_is_restarted_without_waiting_for_the_gate(lab, capsys):
    lab.install(lab.variant(prefill_env={"PDSERVE_STANDIN_STARTUP_DELAY": "600"}, start_timeout=GATE_TIMEOUT_SEC))
    unit = lab.unit("prefill")
    lab.container.run(["systemctl", "start", "--no-block", unit], timeout=30)

    def in_start_post():
        state = lab.states()[unit]
        started = (state.active_state, state.sub_state) == ("activating", "start-post") and state.main_pid
        return state if started else None

    before = wait_for(in_start_post, 60, f"{unit} to reach activating (start-post)")
    time.sleep(3)  # the gate is in its wait: the stand-in answers /health 503
    assert in_start_post(), lab.diagnostics()
    lab.container.run(["kill", "-KILL", str(before.main_pid)])
    killed = time.monotonic()

    def left_start_post():
        state = lab.states()[unit]
        return (state.n_restarts > before.n_restarts or (state.active_state, state.sub_state) !=
                ("activating", "start-post") or (state.main_pid not in (0, before.main_pid)))

    wait_for(left_start_post, GATE_TIMEOUT_SEC, f"{unit} to leave start-post after its main process was killed", 0.1)
    left_after = time.monotonic() - killed

    def restarted():
        state = lab.states()[unit]
        return state if state.n_restarts > before.n_restarts and state.main_pid not in (0, before.main_pid) else None

    after = wait_for(restarted, 60, f"{unit} to be started again by Restart=on-failure")
    journal = lab.container.journal(unit, 200)
    with capsys.disabled():
        print(f"\nprefill PID {before.main_pid} killed in start-post; the unit left it after {left_after:.2f} s "
              f"(the gate's own deadline was {GATE_TIMEOUT_SEC - 10} s away); restarted as PID {after.main_pid} "
              f"(NRestarts {before.n_restarts} -> {after.n_restarts})")
    assert left_after < LEFT_WITHIN_S, lab.diagnostics()
    assert f"the unit's main process (PID {before.main_pid}) exited while its readiness gate waited" in journal, journal
