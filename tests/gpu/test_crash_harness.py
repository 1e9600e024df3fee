"""The GPU tier's crash-under-load harness end to end on the CPU: stand-in SGLang workers (the test fixture)
sharing "GPU 0", the REAL router (smg 1.13.0) behind pdserve's keyed launcher with its key in a credentials
directory, a kill -9 of the prefill's process group under load, the restart after RestartSec and its gate.

On the GPU machines this file is left out (run_on_device.sh): there it would spend device time on
stand-ins; CI runs it. What it asserts is the harness's own behaviour and what holds for any router that
stays up: the port never refuses, every failure is one the client sees, requests succeed again.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from pdserve.render.toolchain import Toolchain
from tests.conftest import require_or_skip
from tests.gpu import crash
from tests.gpu.load import EMPTY
from tests.gpu.pd_run import PDRun, group_members, pdserve_executable, write_api_key, write_deployment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.integration


@pytest.fixture
def standin_pd(visible_tmp_path):
    # The model and tools go where the units could see them: check refuses /tmp (PrivateTmp=yes).
    tmp_path = visible_tmp_path
    have = all(importlib.util.find_spec(m) is not None for m in ("smg", "openai"))
    require_or_skip(have, "smg and openai are not installed in this Python", "PDSERVE_REQUIRE_PARSERS")
    sys.path.insert(0, str(FIXTURES))
    try:
        from standin_sglang import make_shim
        from standin_sglang.launch import free_ports
    finally:
        sys.path.remove(str(FIXTURES))
    ports = dict(zip(("prefill", "decode", "router", "bootstrap", "prometheus"), free_ports(5), strict=True))
    config = write_deployment(tmp_path, tmp_path / "tiny", ports, numa_node=None, gpus=1,
                              api_key_file=write_api_key(tmp_path))
    tools = Toolchain(sglang_python=sys.executable, numactl="/usr/bin/numactl", pdserve=pdserve_executable(tmp_path))
    run = PDRun(config, tmp_path, tools)
    path = [str(make_shim(tmp_path / "shim")), str(FIXTURES), os.environ.get("PYTHONPATH", "")]
    run.extra_env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    try:
        run.up()
        yield run
    finally:
        run.stop()


def test_prefill_kill_under_load_restarts_it_and_the_keyed_router_recovers(standin_pd):
    run = standin_pd
    router_argv = run.launch["router"].argv
    assert router_argv[1:5] == (run.tools.keyed_launcher, "router", "api-key", "--"), router_argv
    assert run.shares_gpus and run.ready_after.keys() == {"prefill", "decode", "router"}
    plan = crash.CrashPlan(rate=5.0, before_s=3.0, request_timeout_s=20.0, streak=5, tail_max_s=120.0,
                           ready_timeout_s=120.0)
    old_group = run.procs["prefill"].pid
    result = crash.kill_under_load(run, plan, "tiny")
    print("\n" + crash.table(result, plan))
    s = result.summary
    assert group_members(old_group) == [] and result.new_pid != result.old_pid
    assert run.procs["prefill"].poll() is None  # the restarted prefill is running
    assert s.failed_before == 0 and s.sent >= 25, s
    assert s.longest_refused_s == 0.0, s  # the router was never touched
    assert EMPTY not in s.causes and s.failed == sum(s.causes.values()), s
    # What fails is the router's answer (or a request's own timeout), never the client's connection.
    assert all(cause.startswith("HTTP 5") or cause == "timeout" for cause in s.causes), s.causes
    assert s.answered_again_s is not None and s.all_succeed_from_s is not None and s.worker_ready_s is not None, s
    assert len(result.timeline) == s.sent and [cause for *_, cause in result.timeline].count("ok") == s.ok
