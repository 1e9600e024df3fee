"""The router settings' rules (pdserve.schema.rules_router) and the port rules that now count the probe port:
each refuses a contradiction naming the field, the value and the fix, and accepts what it suggests."""

from __future__ import annotations

import pytest

from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError, Severity
from pdserve.schema.router import RouterSpec
from pdserve.schema.rules_router import HOLD_WARN_SEC, retry_budget_ms


def _problems(data):
    """(field, value, message, fix, severity) of every problem, errors and warnings alike."""
    try:
        loaded = deployment_from_data(data, "test")
    except ConfigError as exc:
        found = exc.problems
    else:
        found = loaded.warnings
    return [(p.field, p.value, p.message, p.fix, p.severity) for p in found]


def _fields(data):
    return [p[0] for p in _problems(data)]


def test_the_reference_settings_pass_every_rule(reference_data):
    assert _problems(reference_data) == []


# ---- the retry budget
def test_the_default_retries_outlast_the_breaker_and_pause_under_a_second():
    # smg's BackoffCalculator: pauses of 50, 75, 112, 168, 250 ms between 6 attempts, up to x1.2 by jitter.
    pauses = [min(50 * 1.5 ** n, 250) for n in range(5)]
    assert retry_budget_ms(RouterSpec()) == pytest.approx(sum(pauses) * 1.2)
    assert retry_budget_ms(RouterSpec()) < 1000
    # The breaker opens at the third failed attempt; the fourth meets it and is answered 503 + Retry-After.
    assert RouterSpec().circuit_breaker and RouterSpec().cb_failure_threshold < RouterSpec().retry_max_retries


@pytest.mark.parametrize("settings,expected_ms", [
    ({"retry_max_retries": 1}, 0),
    ({"retry_max_retries": 4, "retry_backoff_multiplier": 1.0, "retry_jitter_factor": 0.0}, 150),
    ({"retry_max_retries": 5, "retry_initial_backoff_ms": 2000, "retry_max_backoff_ms": 1000,
      "retry_jitter_factor": 0.0},
     4000),
    ({"retry_max_retries": 4, "retry_backoff_multiplier": 2.0, "retry_jitter_factor": 0.0}, 50 + 100 + 200),
])
def test_retry_budget_matches_smgs_backoff(settings, expected_ms):
    assert retry_budget_ms(RouterSpec(**settings)) == pytest.approx(expected_ms)


def test_retry_budget_of_huge_values_is_computed_at_once():
    # 2^32 - 1 attempts: a closed form, not a loop over them.
    budget = retry_budget_ms(RouterSpec(retry_max_retries=2**32 - 1, retry_backoff_multiplier=1.0000001))
    assert budget > 1e12


def test_a_retry_budget_past_the_request_timeout_is_refused(reference_data):
    reference_data["router"].update(retry_max_retries=200, retry_max_backoff_ms=10_000, request_timeout_secs=600)
    problems = [p for p in _problems(reference_data) if p[0] == "router.retry_max_retries"]
    assert len(problems) == 1 and problems[0][4] is Severity.ERROR
    _field, value, message, fix, _ = problems[0]
    assert value == 200 and "request_timeout_secs (600)" in message and "lower router.retry_max_retries" in fix


def test_backoffs_upside_down_are_refused_as_smg_refuses_them(reference_data):
    reference_data["router"].update(retry_initial_backoff_ms=5000, retry_max_backoff_ms=100)
    (problem,) = [p for p in _problems(reference_data) if p[0] == "router.retry_max_backoff_ms"]
    assert problem[1] == 100 and "retry_initial_backoff_ms (5000)" in problem[2] and "at least 5000" in problem[3]


# ---- the pool idle timeout against SGLang's keep-alive
def test_pool_idle_at_or_past_the_keep_alive_is_refused(reference_data):
    reference_data["router"]["upstream_pool_idle_timeout_secs"] = 75
    (problem,) = _problems(reference_data)
    field, value, message, fix, severity = problem
    assert (field, value, severity) == ("router.upstream_pool_idle_timeout_secs", 75, Severity.ERROR)
    assert "environment.SGLANG_TIMEOUT_KEEP_ALIVE = '75'" in message and "500" in message
    assert fix.startswith("lower it to at most 74")
    reference_data["router"]["upstream_pool_idle_timeout_secs"] = 74
    assert _problems(reference_data) == []


def test_keep_alive_unset_is_sglangs_five_seconds(reference_data):
    del reference_data["environment"]["SGLANG_TIMEOUT_KEEP_ALIVE"]
    assert _problems(reference_data) == []  # 3 s under 5 s
    reference_data["router"]["upstream_pool_idle_timeout_secs"] = 5
    (problem,) = _problems(reference_data)
    assert problem[0] == "router.upstream_pool_idle_timeout_secs" and "SGLang's 5 s" in problem[2]
    assert "at most 4" in problem[3] and "environment.SGLANG_TIMEOUT_KEEP_ALIVE" in problem[3]


def test_a_servers_own_keep_alive_counts(reference_data):
    reference_data["decode"]["env"] = {"SGLANG_TIMEOUT_KEEP_ALIVE": "2"}
    (problem,) = _problems(reference_data)
    assert problem[0] == "router.upstream_pool_idle_timeout_secs"
    assert "decode.env.SGLANG_TIMEOUT_KEEP_ALIVE" in problem[2]


@pytest.mark.parametrize("text,expected", [
    ("soon", ["environment.SGLANG_TIMEOUT_KEEP_ALIVE"]),  # SGLang keeps its 5 s: 3 s still fits
    ("0", ["environment.SGLANG_TIMEOUT_KEEP_ALIVE"]),
    ("-3", ["environment.SGLANG_TIMEOUT_KEEP_ALIVE"]),
    ("7.5", ["environment.SGLANG_TIMEOUT_KEEP_ALIVE"]),
    (" 75 ", []),  # int() reads it, as SGLang does
    ("3", ["router.upstream_pool_idle_timeout_secs"]),
])
def test_odd_keep_alive_values_are_read_as_sglang_reads_them(reference_data, text, expected):
    reference_data["environment"]["SGLANG_TIMEOUT_KEEP_ALIVE"] = text
    assert _fields(reference_data) == expected


# ---- admission
def test_a_queue_without_an_inflight_limit_is_refused(reference_data):
    reference_data["router"].update(prefill_queue_size=10, prefill_queue_timeout_secs=5)
    problems = _problems(reference_data)
    assert [p[0] for p in problems] == ["router.prefill_queue_size", "router.prefill_queue_timeout_secs"]
    assert all("smg refuses to start" in p[2] and "prefill_max_inflight_requests_per_worker" in p[3]
               for p in problems)
    reference_data["router"]["prefill_max_inflight_requests_per_worker"] = 32
    assert _problems(reference_data) == []


def test_a_queue_wait_past_the_request_timeout_is_refused(reference_data):
    reference_data["router"].update(prefill_max_inflight_requests_per_worker=8, prefill_queue_timeout_secs=600,
                                    request_timeout_secs=300)
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.prefill_queue_timeout_secs", 600) and "at most 299" in problem[3]


def test_smgs_own_queue_wait_counts_when_unset(reference_data):
    reference_data["router"].update(prefill_max_inflight_requests_per_worker=8, request_timeout_secs=60)
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.prefill_queue_timeout_secs", None) and "60 s" in problem[2]


def test_holding_requests_through_a_restart_without_a_bound_is_a_warning(reference_data):
    # The opt-in hold: no breaker, the worker stays in the router 60 s and the retries last as long.
    reference_data["router"].update(circuit_breaker=False, health_failure_threshold=60, retry_max_retries=70,
                                    retry_max_backoff_ms=1000)
    (problem,) = _problems(reference_data)
    assert problem[0] == "router.prefill_max_inflight_requests_per_worker" and problem[4] is Severity.WARNING
    assert "held up to" in problem[2] and "prefill_queue_size" in problem[3]
    reference_data["router"].update(prefill_max_inflight_requests_per_worker=16, prefill_queue_size=32,
                                    prefill_queue_timeout_secs=90)
    assert _problems(reference_data) == []


def test_long_retries_with_the_breaker_on_hold_nothing(reference_data):
    # The breaker answers once the attempts open it, however long they could go on.
    reference_data["router"].update(health_failure_threshold=60, retry_max_retries=70, retry_max_backoff_ms=1000)
    assert _problems(reference_data) == []
    assert HOLD_WARN_SEC < retry_budget_ms(RouterSpec(retry_max_retries=70, retry_max_backoff_ms=1000)) / 1000


# ---- the breaker, and what a request that meets a dead worker ends with
def test_breaker_settings_without_the_breaker_are_a_warning(reference_data):
    reference_data["router"].update(circuit_breaker=False, cb_timeout_duration_secs=5, retry_max_retries=10,
                                    retry_max_backoff_ms=1000)
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.cb_timeout_duration_secs", 5) and problem[4] is Severity.WARNING
    assert "circuit_breaker = true" in problem[3]


def test_a_breaker_that_keeps_a_worker_out_long_is_a_warning(reference_data):
    reference_data["router"]["cb_timeout_duration_secs"] = 60  # smg's own default
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.cb_timeout_duration_secs", 60) and "at most 10" in problem[3]


def test_attempts_that_end_before_the_breaker_opens_are_a_warning(reference_data):
    reference_data["router"]["retry_max_retries"] = 3  # the breaker opens at the third
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.retry_max_retries", 3) and problem[4] is Severity.WARNING
    assert "502 without Retry-After" in problem[2]


def test_without_the_breaker_retries_shorter_than_the_health_check_are_a_warning(reference_data):
    reference_data["router"]["circuit_breaker"] = False  # 0.8 s of pauses against 3 s to mark the worker
    (problem,) = _problems(reference_data)
    assert problem[0] == "router.retry_max_retries" and "3 s the health check takes" in problem[2]
    reference_data["router"].update(retry_max_retries=10, retry_max_backoff_ms=1000)  # 3.5 s of pauses
    assert _problems(reference_data) == []


# ---- the probe port
def test_the_probe_port_collides_with_no_other_listener(reference_data):
    reference_data["router"]["health_check_port"] = reference_data["router"]["prometheus_port"]
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.health_check_port", 29000) and "router.prometheus_port" in problem[2]


def test_the_probe_port_collides_with_a_worker(reference_data):
    reference_data["router"]["health_check_port"] = reference_data["prefill"]["port"]
    assert _fields(reference_data) == ["router.health_check_port"]


def test_the_probe_port_collides_per_host_in_a_multi_host_file(two_host_data):
    two_host_data["router"]["health_check_port"] = two_host_data["router"]["port"]
    assert "router.health_check_port" in _fields(two_host_data)


# ---- the drain (moved here from rules.py; tests/unit/test_router_resilience.py has the rest)
def test_a_drain_as_long_as_the_stop_timeout_is_refused(reference_data):
    reference_data["router"]["shutdown_grace_period_secs"] = 120
    (problem,) = _problems(reference_data)
    assert problem[:2] == ("router.shutdown_grace_period_secs", 120) and "at most 115" in problem[3]


# ---- field bounds: smg's own (its start-up validation), or narrower where smg's would defeat the setting
@pytest.mark.parametrize("field,value", [
    ("upstream_pool_idle_timeout_secs", 0),  # smg: keep forever, past any keep-alive
    ("health_check_interval_secs", 0), ("health_failure_threshold", 0), ("health_success_threshold", 0),
    ("retry_max_retries", 0), ("retry_backoff_multiplier", 0.5), ("retry_backoff_multiplier", float("inf")),
    ("retry_jitter_factor", 1.5), ("retry_jitter_factor", float("nan")), ("retry_initial_backoff_ms", 0),
    ("cb_failure_threshold", 0), ("prefill_queue_size", -1), ("prefill_queue_timeout_secs", 0),
    ("prefill_max_inflight_requests_per_worker", 0), ("prefill_max_inflight_requests_per_worker", 2**31),
    ("retry_max_retries", 2**32), ("health_check_port", 0),
    ("health_check_port", 65536), ("retry_max_retries", True), ("retry_backoff_multiplier", "1.5"),
])
def test_values_out_of_range_are_refused_by_field(reference_data, field, value):
    reference_data["router"][field] = value
    assert f"router.{field}" in _fields(reference_data)


@pytest.fixture
def two_host_data():
    import tomllib
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "hosts" / "two-host" / "deployment.toml").read_text()
    return tomllib.loads(text)
