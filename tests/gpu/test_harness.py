"""The GPU tier's process handling, checked on the CPU with ordinary processes in the servers' place:
a server that dies fails its gate at once, and stopping leaves no process of a group behind."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from pdserve.render.toolchain import Toolchain
from tests.fixtures.ports import free_ports
from tests.gpu.pd_run import PDRun, pdserve_executable, write_deployment


@pytest.fixture
def run(visible_tmp_path) -> PDRun:
    # The model and tools go where the units could see them: check refuses /tmp (PrivateTmp=yes).
    tmp_path = visible_tmp_path
    # Free ports, not fixed ones: CI's container tier shares the host network, and so do parallel runs.
    ports = dict(zip(("prefill", "decode", "router", "bootstrap", "prometheus"), free_ports(5), strict=True))
    config = write_deployment(tmp_path, tmp_path / "tiny", ports, numa_node=None)
    tools = Toolchain(sglang_python=sys.executable, numactl="/usr/bin/numactl", pdserve=pdserve_executable(tmp_path))
    pd = PDRun(config, tmp_path, tools)
    yield pd
    pd.stop()


def _as(run: PDRun, role: str, code: str) -> None:
    """Put a Python one-liner in the role's place (its rendered environment and logging stay)."""
    run.launch[role] = dataclasses.replace(run.launch[role], argv=(sys.executable, "-c", code))


def _group_alive(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1][0] != "Z"]


def test_a_server_that_dies_fails_the_gate_at_once_with_its_log(run):
    _as(run, "prefill", "print('model failed to load'); raise SystemExit(3)")
    run.start("prefill")
    began = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        run.gate(["prefill"], timeout=300)
    assert time.monotonic() - began < 30
    assert "prefill: server exited with 3 before it was ready" in str(failed.value)
    assert "model failed to load" in str(failed.value)


def test_stop_kills_the_whole_group_also_after_the_leader_exited(run):
    # The leader starts a long-lived child (as SGLang starts its scheduler) and exits.
    _as(run, "decode",
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])")
    run.start("decode")
    leader = run.procs["decode"]
    leader.wait(30)
    assert _group_alive(leader.pid), "the child should still be running before stop()"
    run.stop()
    deadline = time.monotonic() + 10
    while _group_alive(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group_alive(leader.pid) == []
