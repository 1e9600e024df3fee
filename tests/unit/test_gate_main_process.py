"""The readiness gate stops the moment the unit's main process ($MAINPID) is gone.

Real processes throughout: a child that is killed, and `pdserve wait-ready` run as systemd runs an
ExecStartPost= command (its own process, $MAINPID in its environment). The same behaviour under real
systemd: tests/integration/systemd/test_gate_main_process.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pdserve.launch.gate import Observation, wait_until_ready, watched
from pdserve.launch.main_process import (
    BadMainPid,
    MainProcess,
    MainProcessGone,
    main_pid_from,
    watched_sleep,
)


def test_main_pid_from_the_environment():
    assert main_pid_from({}) is None
    assert main_pid_from({"MAINPID": ""}) is None
    assert main_pid_from({"MAINPID": "4242"}) == 4242
    for bad in ("1", "0", "-5", "12a", "١٢٣", " 42", "99999999999"):
        with pytest.raises(BadMainPid):
            main_pid_from({"MAINPID": bad})


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_a_running_process_is_not_gone_and_a_killed_one_is_seen_at_once(child):
    main = MainProcess.open(child.pid)
    try:
        assert not main.gone()
        began = time.monotonic()
        assert main.wait(0.2) is False
        assert time.monotonic() - began >= 0.19
        script = f"import os, time; time.sleep(0.3); os.kill({child.pid}, {int(signal.SIGKILL)})"
        killer = subprocess.Popen([sys.executable, "-c", script])
        began = time.monotonic()
        assert main.wait(20) is True  # wakes when the process ends, not at the end of the wait
        assert time.monotonic() - began < 5
        assert main.gone()
        killer.wait(timeout=10)
    finally:
        main.close()


def test_without_pidfd_the_signal_probe_sees_it_too(child):
    main = MainProcess(child.pid)  # no pidfd: the fallback where pidfd_open is refused
    assert not main.gone()
    child.kill()
    child.wait(timeout=10)  # reaped, as systemd reaps its main process
    assert main.wait(5) is True


def test_the_wait_ends_with_main_process_gone(child):
    main = MainProcess.open(child.pid)
    probes = []

    def probe() -> Observation:
        probes.append(1)
        if len(probes) == 2:
            child.kill()
        return Observation(False, "loading")

    began = time.monotonic()
    with pytest.raises(MainProcessGone, match=f"PID {child.pid}"):
        wait_until_ready(watched(probe, main), timeout=60, interval=1.0, sleep=watched_sleep(main))
    assert time.monotonic() - began < 10
    main.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wait_ready_exits_nonzero_when_its_main_process_dies(child, tmp_path):
    """As ExecStartPost= runs it: a worker that never answers (its port is closed) and whose process dies."""
    import json
    import tomllib

    from pdserve.schema.loading import default_profile_text

    data = tomllib.loads(default_profile_text())
    data["decode"]["port"] = _free_port()
    config = tmp_path / "dep.json"
    config.write_text(json.dumps(data))
    pdserve = [sys.executable, "-m", "pdserve.cli.main"]
    env = dict(os.environ, MAINPID=str(child.pid))
    gate = subprocess.Popen([*pdserve, "wait-ready", "decode", "-c", str(config), "--timeout", "300"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert gate.poll() is None, gate.communicate()
        child.kill()
        killed = time.monotonic()
        _, err = gate.communicate(timeout=20)
        assert time.monotonic() - killed < 5, err
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait(timeout=10)
    assert gate.returncode == 1
    assert f"the unit's main process (PID {child.pid}) exited while its readiness gate waited" in err
    assert "journalctl -u sglang-dsv4-decode" in err


def test_a_bad_mainpid_is_a_usage_error(tmp_path):
    gate = subprocess.run([sys.executable, "-m", "pdserve.cli.main", "wait-ready", "decode", "--timeout", "1"],
                          env=dict(os.environ, MAINPID="1"), capture_output=True, text=True, timeout=60, check=False)
    assert gate.returncode == 2
    assert "$MAINPID=1 is not the unit's main process" in gate.stderr
