"""The router outlives its workers: unit ordering, the start gate, and the flags that let it ride out a
worker's restart (issue 14, item 3; smg's settings: issue 41, item 2). Rendered text parsed back; the real
parser check is in
tests/integration/test_real_parsers.py."""

from __future__ import annotations

import shlex

import pytest

from pdserve.render.argv import router_args
from pdserve.render.units import WORKER_GATE_SEC, render_units
from pdserve.schema.derived import router_shutdown_grace
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from tests.unit.test_units import CONFIG, parse_unit


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _loaded(data):
    try:
        loaded = deployment_from_data(data, "test")
    except ConfigError as exc:
        return None, [(p.field, p.message) for p in exc.problems]
    return loaded.deployment, [(p.field, p.message) for p in loaded.warnings]


def test_default_flags_answer_an_outage_fast_and_ride_out_a_stall(reference):
    args = router_args(reference)
    # The breaker opens on the third failed attempt (every retry counts in PD mode) and tries the worker
    # again after 1 s; one answered request closes it (smg: 10, 60 s, 3).
    assert "--disable-circuit-breaker" not in args
    assert [_flag(args, f) for f in ("--cb-failure-threshold", "--cb-timeout-duration-secs",
                                     "--cb-success-threshold")] == ["3", "1", "1"]
    # 6 attempts 50 to 250 ms apart: the fourth meets the open breaker (503, Retry-After), well within 1 s.
    assert [_flag(args, f) for f in ("--retry-max-retries", "--retry-initial-backoff-ms", "--retry-max-backoff-ms",
                                     "--retry-backoff-multiplier", "--retry-jitter-factor")] == \
        ["6", "50", "250", "1.5", "0.2"]
    # The health check marks a dead worker after 3 probes 1 s apart and takes it back after one good one.
    assert [_flag(args, f) for f in ("--health-check-interval-secs", "--health-failure-threshold",
                                     "--health-success-threshold")] == ["1", "3", "1"]
    # Pooled connections are dropped before SGLang's keep-alive closes them (smg's own default, written out).
    assert _flag(args, "--upstream-pool-idle-timeout-secs") == "3"
    # The reference deployment answers probes on a port of their own.
    assert _flag(args, "--health-check-port") == "29001"
    # No admission limit unless the deployment measures one (smg's default).
    assert not [a for a in args if a.startswith(("--prefill-max-inflight", "--prefill-queue"))]
    # The drain ends before systemd's SIGKILL (router default 180 s, TimeoutStopSec 120 s).
    grace = int(_flag(args, "--shutdown-grace-period-secs"))
    assert grace == 30 < reference.systemd.stop_timeout_sec


def test_fields_reach_the_router_flags(reference_data):
    reference_data["router"].update(
        circuit_breaker=True, cb_failure_threshold=5, cb_success_threshold=2, cb_timeout_duration_secs=5,
        retry_max_retries=7, retry_initial_backoff_ms=20, retry_max_backoff_ms=500, retry_backoff_multiplier=2.0,
        retry_jitter_factor=0.0, health_check_interval_secs=9, health_failure_threshold=4,
        health_success_threshold=3, shutdown_grace_period_secs=40, upstream_pool_idle_timeout_secs=60,
        health_check_port=29011, prefill_max_inflight_requests_per_worker=64, prefill_queue_size=0,
        prefill_queue_timeout_secs=20)
    dep, problems = _loaded(reference_data)
    assert problems == []
    args = router_args(dep)
    assert "--disable-circuit-breaker" not in args
    flags = {"--cb-failure-threshold": "5", "--cb-success-threshold": "2", "--cb-timeout-duration-secs": "5",
             "--retry-max-retries": "7", "--retry-initial-backoff-ms": "20", "--retry-max-backoff-ms": "500",
             "--retry-backoff-multiplier": "2.0", "--retry-jitter-factor": "0.0",
             "--health-check-interval-secs": "9", "--health-failure-threshold": "4",
             "--health-success-threshold": "3", "--shutdown-grace-period-secs": "40",
             "--upstream-pool-idle-timeout-secs": "60", "--health-check-port": "29011",
             "--prefill-max-inflight-requests-per-worker": "64", "--prefill-queue-size": "0",
             "--prefill-queue-timeout-secs": "20"}
    assert {flag: _flag(args, flag) for flag in flags} == flags
    assert all(args.count(flag) == 1 for flag in flags)


@pytest.mark.parametrize("stop,grace", [(120, 30), (20, 15), (6, 1), (3, 1)])
def test_unset_grace_stays_below_the_stop_timeout(reference_data, stop, grace):
    reference_data.setdefault("systemd", {})["stop_timeout_sec"] = stop
    dep, problems = _loaded(reference_data)
    assert problems == []
    assert router_shutdown_grace(dep) == grace
    assert _flag(router_args(dep), "--shutdown-grace-period-secs") == str(grace)


def test_a_grace_that_outlasts_the_stop_timeout_is_refused(reference_data):
    reference_data["router"]["shutdown_grace_period_secs"] = 120
    _, problems = _loaded(reference_data)
    assert [f for f, _ in problems] == ["router.shutdown_grace_period_secs"]
    assert "stop_timeout_sec (120)" in problems[0][1]


def test_a_stop_timeout_with_no_room_for_the_derived_drain_is_refused(reference_data):
    reference_data.setdefault("systemd", {})["stop_timeout_sec"] = 1
    _, problems = _loaded(reference_data)
    assert [f for f, _ in problems] == ["systemd.stop_timeout_sec"]


def test_the_suggested_lower_grace_passes_the_same_rule(reference_data):
    reference_data.setdefault("systemd", {})["stop_timeout_sec"] = 4
    reference_data["router"]["shutdown_grace_period_secs"] = 4
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(reference_data, "test")
    assert [p.fix.split(",")[0] for p in caught.value.problems] == ["lower it to at most 3"]
    reference_data["router"]["shutdown_grace_period_secs"] = 3
    assert _loaded(reference_data)[1] == []


@pytest.mark.parametrize("arg", ["--disable-circuit-breaker", "--retry-max-retries=3", "--disable-retries",
                                 "--health-check-interval-secs=60", "--shutdown-grace-period-secs=180",
                                 "--health-check-port=1", "--upstream-pool-idle=9", "--prefill-queue-size=3",
                                 "--cb-failure-threshold=2", "--health-failure-threshold=9"])
def test_rendered_resilience_flags_cannot_be_repeated_in_extra_args(reference_data, arg):
    reference_data["router"]["extra_args"] = [arg]
    _, problems = _loaded(reference_data)
    assert [f for f, _ in problems] == ["router.extra_args"], problems


def test_router_unit_starts_its_process_only_with_both_workers_ready(reference, tools):
    units = {u.name: parse_unit(u.text) for u in render_units(reference, tools, CONFIG)}
    service = units["sglang-dsv4-router"]["Service"]
    gates = [shlex.split(line) for line in service["ExecStartPre"]]
    assert [g[:3] for g in gates] == [[tools.pdserve, "wait-ready", "prefill"], [tools.pdserve, "wait-ready", "decode"]]
    for gate in gates:
        assert gate[gate.index("--config") + 1] == CONFIG
        # Short: After= already waited for the workers' starts to end; this only confirms they are ready.
        assert float(gate[gate.index("--timeout") + 1]) == WORKER_GATE_SEC
    # The workers wait for nothing before their process starts; a PD server only leaves the routers first
    # (pdserve leave-routers, which never fails the start: tests/unit/test_gate_warm_up.py).
    assert "ExecStartPre" not in units["sglang-dsv4"]["Service"]
    for worker in ("prefill", "decode"):
        (pre,) = units[f"sglang-dsv4-{worker}"]["Service"]["ExecStartPre"]
        assert shlex.split(pre)[1:3] == ["leave-routers", worker]
