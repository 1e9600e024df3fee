"""Check logic for units and the router, fed recorded observations."""

from dataclasses import replace

from pdserve.probes.observations import HttpObs
from pdserve.probes.systemctl import UnitState, parse_show
from pdserve.schema.loading import load
from pdserve.verify.checks import router, units
from pdserve.verify.expect import expectations

EXP = expectations(load().deployment)

SHOW_ACTIVE = """Id=sglang-dsv4-prefill.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
Result=success
ExecMainStatus=0
ExecMainCode=0
MainPID=4242
NRestarts=0
ControlGroup=/system.slice/sglang-dsv4-prefill.service
"""

SHOW_FAILED = """Id=sglang-dsv4-decode.service
LoadState=loaded
ActiveState=failed
SubState=failed
UnitFileState=disabled
Result=exit-code
ExecMainStatus=1
ExecMainCode=1
NRestarts=5
"""


def show(text: str) -> UnitState:
    (state,) = parse_show(text).values()
    return state


def test_parse_show_reads_the_verifiers_properties_too():
    state = show(SHOW_ACTIVE + "Description=a=b\n")
    assert state.active_state == "active" and state.main_pid == 4242
    assert state.control_group == "/system.slice/sglang-dsv4-prefill.service"
    failed = show(SHOW_FAILED)
    assert (failed.exec_main_code, failed.exec_main_status, failed.n_restarts) == (1, 1, 5)


def test_active_enabled_unit_passes():
    result = units.check_pd_unit("units.prefill", "sglang-dsv4-prefill", show(SHOW_ACTIVE), [])
    assert result.status == "pass"
    assert "active (running), enabled" in result.observed


def test_failed_unit_reports_result_exit_status_and_journal():
    journal = ["torch.OutOfMemoryError: CUDA out of memory", "Main process exited, code=exited, status=1/FAILURE"]
    result = units.check_pd_unit("units.decode", "sglang-dsv4-decode", show(SHOW_FAILED), journal)
    assert result.status == "fail"
    assert "Result=exit-code" in result.observed and "ExecMainStatus=1 (exited)" in result.observed
    assert "journal: torch.OutOfMemoryError: CUDA out of memory" in result.details
    assert "journalctl -u sglang-dsv4-decode" in result.remediation


def test_active_but_not_enabled_warns():
    props = show(SHOW_ACTIVE.replace("UnitFileState=enabled", "UnitFileState=disabled"))
    result = units.check_pd_unit("units.router", "sglang-dsv4-router", props, [])
    assert result.status == "warn" and "systemctl enable sglang-dsv4-router" in result.remediation


def test_missing_unit_fails_with_install_hint():
    result = units.check_pd_unit("units.router", "sglang-dsv4-router", UnitState("sglang-dsv4-router.service"), [])
    assert result.status == "fail" and "pdserve render" in result.remediation


def test_fallback_disabled_and_inactive_passes():
    props = UnitState("sglang-dsv4.service", "loaded", "inactive", "dead", unit_file_state="disabled")
    assert units.check_fallback_unit("units.fallback", "sglang-dsv4", props, []).status == "pass"


def test_fallback_failed_is_explained():
    result = units.check_fallback_unit("units.fallback", "sglang-dsv4", show(SHOW_FAILED),
                                       ["address already in use: port 30001"])
    assert result.status == "fail"
    assert "ExecMainStatus=1" in result.observed
    assert "journal: address already in use: port 30001" in result.details
    assert "reset-failed sglang-dsv4" in result.remediation


def test_fallback_enabled_or_active_fails():
    enabled = UnitState("sglang-dsv4.service", "loaded", "inactive", unit_file_state="enabled")
    fallback = units.check_fallback_unit("units.fallback", "sglang-dsv4", enabled, [])
    assert "systemctl disable sglang-dsv4" in fallback.remediation
    active = replace(enabled, active_state="active", unit_file_state="disabled")
    result = units.check_fallback_unit("units.fallback", "sglang-dsv4", active, [])
    assert result.status == "fail" and "disable --now" in result.remediation


def test_fallback_not_installed_warns():
    fallback = units.check_fallback_unit("units.fallback", "sglang-dsv4", UnitState("sglang-dsv4.service"), [])
    assert fallback.status == "warn"


def _ok(url, body=None):
    return HttpObs(url, 200, body)


def test_router_ready_passes():
    obs = _ok("r/readiness", {"status": "ready", "healthy_workers": 2, "total_workers": 2})
    assert router.check_readiness(EXP, obs, {}).status == "pass"


def test_router_not_ready_names_the_worker_that_is_down():
    obs = HttpObs("r/readiness", 503, {"healthy_workers": 0, "total_workers": 0})
    health = {"prefill": HttpObs("http://127.0.0.1:30000/health", 503), "decode": _ok("d/health")}
    result = router.check_readiness(EXP, obs, health)
    assert result.status == "fail"
    assert "not healthy: prefill" in result.observed and "decode" not in result.observed.split("not healthy:")[1]
    assert "journalctl -u sglang-dsv4-prefill" in result.remediation


def test_router_with_healthy_workers_but_none_registered_says_restart():
    obs = HttpObs("r/readiness", 503, {"healthy_workers": 0, "total_workers": 0})
    health = {"prefill": _ok("p/health"), "decode": _ok("d/health")}
    result = router.check_readiness(EXP, obs, health)
    assert result.status == "fail" and "systemctl restart sglang-dsv4-router" in result.remediation


def _workers(*entries):
    return _ok("r/workers", {"workers": [
        {"url": url, "worker_type": kind, "is_healthy": True, **({"bootstrap_port": port} if port else {})}
        for url, kind, port in entries]})


def test_workers_exactly_as_configured_pass():
    obs = _workers(("http://127.0.0.1:30000", "prefill", 8998), ("http://127.0.0.1:30002", "decode", None))
    result = router.check_workers(EXP, obs)
    assert result.status == "pass" and "bootstrap 8998" in result.observed


def test_workers_wrong_bootstrap_port_and_extra_worker_fail():
    obs = _workers(("http://127.0.0.1:30000", "prefill", 8999), ("http://127.0.0.1:30002", "decode", None),
                   ("http://127.0.0.1:31000", "decode", None))
    result = router.check_workers(EXP, obs)
    assert result.status == "fail"
    assert any("bootstrap port 8999, configured 8998" in d for d in result.details)
    assert any("31000 is registered but not in the deployment" in d for d in result.details)


def test_missing_decode_fails():
    result = router.check_workers(EXP, _workers(("http://127.0.0.1:30000", "prefill", 8998)))
    assert result.status == "fail"
    assert any("decode http://127.0.0.1:30002 is not registered" in d for d in result.details)


REFUSED = HttpObs("http://127.0.0.1:30000/health", None, None, "ConnectError: [Errno 111] Connection refused")


def test_router_ready_fails_when_a_worker_itself_is_down():
    """The router's 2/2 is as old as its last health check; the prefill's own /health is refused."""
    obs = _ok("r/readiness", {"status": "ready", "healthy_workers": 2, "total_workers": 2})
    result = router.check_readiness(EXP, obs, {"prefill": REFUSED, "decode": _ok("d/health")})
    assert result.status == "fail"
    assert "2/2 workers healthy by the router's last health check" in result.observed
    assert "prefill /health" in result.observed and "Connection refused" in result.observed
    assert "journalctl -u sglang-dsv4-prefill" in result.remediation and "decode" not in result.remediation


def test_workers_listed_healthy_fail_when_a_worker_itself_is_down():
    obs = _workers(("http://127.0.0.1:30000", "prefill", 8998), ("http://127.0.0.1:30002", "decode", None))
    result = router.check_workers(EXP, obs, {"prefill": REFUSED, "decode": _ok("d/health")})
    assert result.status == "fail" and "prefill /health" in result.observed
    assert router.check_workers(EXP, obs, {"prefill": _ok("p/health"), "decode": _ok("d/health")}).status == "pass"
