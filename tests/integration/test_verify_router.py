"""`pdserve verify` against the REAL router, smg 1.13.0, in PD mode in front of two stand-in workers.

The healthy setup must pass; each injected fault must fail exactly the matching check, with a
remediation that points at the cause (a verifier that passes everything is worthless).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from pd_cluster import PDCluster, serving, write_deployment
from standin_sglang.launch import wait_http

from pdserve.cli.main import main
from pdserve.schema import pins
from pdserve.verify.report import Report

pytestmark = pytest.mark.integration

# Checks that need systemd or NVML or a numa_node; the test host has none of them.
HOST_ONLY = "units,gpu,numa"


def _pdserve() -> list[str]:
    exe = Path(sys.executable).with_name("pdserve")
    return [str(exe)] if exe.exists() else [shutil.which("pdserve") or "pdserve"]


def verify_in_process(config: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["verify", "-c", str(config), "--json", "--probe-timeout", "5",
                                       "--chat-timeout", "30", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def failing(report: dict) -> set[str]:
    return {c["id"] for c in report["checks"] if c["status"] == "fail"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pd")
    # A worker that turns unhealthy is dropped at the router's first failed health check (pdserve renders
    # checks every router.health_check_interval_secs = 1 s and re-admission after one success).
    with serving(write_deployment(workdir, router={"health_failure_threshold": 1}), workdir) as c:
        yield c


@pytest.fixture
def healthy(cluster):
    with cluster.healthy():
        yield cluster


def test_healthy_deployment_passes_through_the_cli(healthy):
    done = subprocess.run([*_pdserve(), "verify", "-c", str(healthy.config), "--json", "--skip", HOST_ONLY,
                           "--probe-timeout", "5", "--chat-timeout", "30"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = Report.model_validate_json(done.stdout).model_dump(by_alias=True)
    assert report["schema_version"] == 1 and report["ok"] and report["exit_code"] == 0
    checks = by_id(report)
    for check_id in ("router.readiness", "router.workers", "kv.prefill", "kv.decode", "server.prefill",
                     "server.decode", "e2e.chat", "e2e.reasoning", "e2e.tools", "e2e.stream",
                     "metrics.prefill", "metrics.decode", "metrics.router", "metrics.kv_transfer",
                     "metrics.router_requests", "exposure.ports", "versions.prefill", "versions.decode",
                     "versions.router"):
        assert checks[check_id]["status"] == "pass", checks[check_id]
    assert f"smg {pins.ROUTER_VERSION} (pid " in checks["versions.router"]["observed"]
    assert "bootstrap" in checks["router.workers"]["observed"]
    # Skipped checks say why; nothing that did not run counts as a pass.
    for check_id in ("units.prefill", "units.fallback", "gpu.memory", "gpu.processes", "numa.prefill"):
        assert checks[check_id]["status"] == "skip"
        assert "excluded by --skip" in checks[check_id]["observed"]
    assert checks["exposure.auth"]["status"] == "skip"
    assert "api_key_file is not set" in checks["exposure.auth"]["observed"]


def test_host_checks_skip_with_their_reason_when_not_excluded(healthy):
    code, report = verify_in_process(healthy.config, "--only", "units,gpu,numa")
    checks = by_id(report)
    assert code == 0
    assert "systemd" in checks["units.router"]["observed"] and checks["units.router"]["status"] == "skip"
    assert checks["gpu.memory"]["status"] == "skip" and "NVML" in checks["gpu.memory"]["observed"]
    assert checks["numa.decode"]["status"] == "skip" and "numa_node is not set" in checks["numa.decode"]["observed"]


FAULTS = [
    # (worker, knobs, the one check that must fail, words its remediation must contain)
    ("decode", {"max_total_num_tokens": 1024}, "kv.decode", "mem_fraction_static"),
    ("prefill", {"max_total_num_tokens": 2048}, "kv.prefill", "mem_fraction_static"),
    ("decode", {"faults": ["reasoning_in_content"]}, "e2e.reasoning", "--reasoning-parser deepseek-v4"),
    ("decode", {"faults": ["tools_unparsed"]}, "e2e.tools", "--tool-call-parser deepseekv4"),
    ("prefill", {"faults": ["wrong_mode"]}, "server.prefill", "disaggregation_mode=decode"),
    ("decode", {"faults": ["no_stream_usage"]}, "e2e.stream", "stream"),
    ("decode", {"faults": ["single_chunk_stream"]}, "e2e.stream", "stream"),
    ("decode", {"version": "0.5.17"}, "versions.decode", "sglang==0.5.23"),
]


@pytest.mark.parametrize("role,knobs,check_id,remedy", FAULTS,
                         ids=[f"{f[2]}-{f[0]}-{next(iter(f[1]))}" for f in FAULTS])
def test_each_fault_fails_exactly_its_check(healthy, role, knobs, check_id, remedy):
    healthy.set_faults(role, **knobs)
    code, report = verify_in_process(healthy.config, "--skip", HOST_ONLY)
    assert code == 1
    assert failing(report) == {check_id}, [(c["id"], c["observed"]) for c in report["checks"] if c["status"] == "fail"]
    check = by_id(report)[check_id]
    assert remedy in check["remediation"] or remedy in check["observed"], check


def test_worker_that_turns_unhealthy_fails_the_router_checks(healthy):
    """A decode whose /health answers 503: the router drops it; the verifier says which worker and why."""
    healthy.set_faults("decode", never_ready=True)
    # The router notices at its next health check (every second here); --wait only re-runs failing checks.
    assert wait_http(f"{healthy.url('router')}/readiness", 30, expect=503) == 503
    code, report = verify_in_process(healthy.config, "--only", "router,kv")
    checks = by_id(report)
    assert code == 1, report
    readiness = checks["router.readiness"]
    assert readiness["status"] == "fail" and "not healthy: decode" in readiness["observed"], readiness
    assert "HTTP 503" in readiness["observed"] and "journalctl -u sglang-itest-decode" in readiness["remediation"]
    assert "decode http://127.0.0.1" in " ".join(checks["router.workers"]["details"])
    assert checks["kv.decode"]["status"] == "pass"  # the server still answers /server_info


def test_unknown_check_id_is_a_usage_error(healthy):
    result = CliRunner().invoke(main, ["verify", "-c", str(healthy.config), "--only", "nonsense"])
    assert result.exit_code == 2 and "matches no check" in result.output


def test_wait_retries_until_a_fault_clears(healthy):
    """--wait re-runs a failing check; here the decode's KV capacity is fixed while the verifier waits."""
    healthy.set_faults("decode", max_total_num_tokens=1024)
    import threading
    timer = threading.Timer(1.5, healthy.reset_faults)
    timer.start()
    try:
        code, report = verify_in_process(healthy.config, "--only", "kv", "--wait", "20", "--interval", "0.5")
    finally:
        timer.cancel()
    assert code == 0
    assert by_id(report)["kv.decode"]["attempts"] > 1


def test_router_started_before_workers_healthy(tmp_path):
    """Workers still loading (port closed, as SGLang while it loads weights) when the router starts, and ready
    only after its --worker-startup-timeout-secs: smg keeps trying and takes them in without a restart.
    (sglang-router 0.3.2 gave up after a few attempts and needed a restart; this test held that before.)"""
    c = PDCluster(write_deployment(tmp_path, worker_startup_timeout=2), tmp_path)
    try:
        c.start_router()
        c.start_worker("prefill", {"PDSERVE_STANDIN_LOAD_DELAY": "8"})
        c.start_worker("decode", {"PDSERVE_STANDIN_LOAD_DELAY": "8"})
        assert wait_http(f"{c.url('router')}/readiness", 60, expect=503, proc=c.procs["router"]) == 503
        code, report = verify_in_process(c.config, "--only", "router.readiness")
        readiness = by_id(report)["router.readiness"]
        assert code == 1 and readiness["status"] == "fail"
        assert "not healthy: prefill" in readiness["observed"] and "no answer" in readiness["observed"]
        assert "still starting" in readiness["remediation"]
        # The workers finish loading after the router's startup timeout: the router takes them in anyway
        # (within about 30 s of its start, as measured here), with no restart.
        c.wait_workers()
        assert c.procs["router"].poll() is None, "the router exited: " + c.logs("router")
        code, report = verify_in_process(c.config, "--only", "router", "--wait", "90", "--interval", "1")
        assert code == 0, by_id(report)
        assert by_id(report)["router.readiness"]["observed"] == "/readiness 200, 2/2 workers healthy"
        assert "bootstrap" in by_id(report)["router.workers"]["observed"]
    finally:
        c.stop()


def test_api_key_enforced_and_a_router_without_it_caught(tmp_path, visible_tmp_path):
    # Not under /tmp: check refuses a key file where any user could create it first.
    key_file = visible_tmp_path / "router.key"
    key_file.write_text("test-key-123\n")
    c = PDCluster(write_deployment(tmp_path, api_key_file=str(key_file)), tmp_path)
    assert c.launch["router"].argv[1].endswith("keyed_launch.py")  # rendered exactly as the unit runs it
    try:
        c.serve()
        # --wait as an operator would use it right after a start: a check that fails once on a loaded
        # 2-core machine is retried; one that keeps failing still fails the test.
        code, report = verify_in_process(c.config, "--only", "exposure,e2e,router", "--wait", "30")
        checks = by_id(report)
        assert code == 0, [(i, x["observed"]) for i, x in checks.items() if x["status"] == "fail"]
        assert checks["exposure.auth"]["status"] == "pass"
        assert checks["exposure.auth"]["observed"] == "without the key: 401; with it: 200"
        assert "test-key-123" not in json.dumps(report)
        # The key is nowhere ps or /proc shows it: not in the router's argv (smg retitles the process
        # "smg::router"; the original argv is the keyed launcher's, without the key) nor in its environment.
        pid = c.procs["router"].pid
        shown = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        assert b"smg::router" in shown and b"test-key-123" not in shown
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30, check=True).stdout
        assert "smg::router" in ps and "test-key-123" not in ps

        # The same deployment, but the router started without its key: clients get in without one.
        c.stop_role("router")
        c.start_router(keyed=False)
        c.wait_router_ready()
        code, report = verify_in_process(c.config, "--only", "exposure.auth")
        auth = by_id(report)["exposure.auth"]
        assert code == 1 and auth["status"] == "fail"
        assert "without the key: 200" in auth["observed"] and "--api-key" in auth["remediation"]
    finally:
        c.stop()
