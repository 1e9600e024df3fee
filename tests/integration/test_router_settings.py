"""The router settings' ranges against the real smg 1.13.0 (issue 41, item 2).

smg's argparse takes almost any number; its ranges are checked by its Rust core when the router starts
(`Configuration error: Invalid value for field ...`), before it binds a port or reaches a worker. So each
case starts the real router, on free loopback ports with nothing behind its worker URLs, and reads which
came first: that error and the exit, or "Starting router on" (the configuration was accepted). Values at the
edges of pdserve's schema must start; values just past them, which the schema refuses, smg refuses too
(or they would defeat the setting, as a pool idle timeout of 0 does: noted where so).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdserve.render.argv import ROUTER_MODULE, router_args
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from tests.conftest import require_or_skip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from standin_sglang.launch import free_ports

pytestmark = pytest.mark.integration

U32 = 2**32 - 1
VERDICT_TIMEOUT_S = 30.0  # smg imports and validates in about a second; CI's two busy cores take longer
ACCEPTED = re.compile(r"Starting router on")
REFUSED = re.compile(r"Configuration error: (.*)")


@pytest.fixture(scope="module")
def smg_available():
    require_or_skip(importlib.util.find_spec("smg") is not None, "smg is not installed in this Python",
                    "PDSERVE_REQUIRE_PARSERS")


def _verdict(args: list[str], log: Path) -> tuple[str, str]:
    """("accepted" | "refused" | "exited", what smg said) for the real router started with `args`."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", ROUTER_MODULE, *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + VERDICT_TIMEOUT_S
        while time.monotonic() < deadline:
            text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
            if ACCEPTED.search(text):
                return "accepted", ""
            refused = REFUSED.search(text)
            if refused:
                return "refused", refused.group(1)
            if proc.poll() is not None:
                return "exited", text[-400:]
            time.sleep(0.1)
        return "undecided", text[-400:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _router_on_free_ports(reference_data: dict, router: dict) -> list[str]:
    """pdserve's rendered router argv for the reference with `router` settings, every port a free one (the
    workers' too: nothing answers there, and smg validates before it looks)."""
    data = copy.deepcopy(reference_data)
    prefill, decode, bootstrap, port, metrics, probes = free_ports(6)
    data["prefill"]["port"], data["decode"]["port"], data["transfer"]["bootstrap_port"] = prefill, decode, bootstrap
    data["router"].update({"port": port, "prometheus_port": metrics, "health_check_port": probes, **router})
    return router_args(deployment_from_data(data, "test").deployment)


# Settings pdserve accepts at the edges of its ranges (and the defaults): smg must start with each.
EDGES = {
    "defaults": {},
    "least": {"health_check_interval_secs": 1, "health_failure_threshold": 1, "health_success_threshold": 1,
              "retry_max_retries": 1, "retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 1,
              "retry_backoff_multiplier": 1.0, "retry_jitter_factor": 0.0, "upstream_pool_idle_timeout_secs": 1,
              "health_check_timeout_secs": 1, "request_timeout_secs": 1, "worker_startup_timeout_secs": 1},
    "most": {"health_check_interval_secs": 3600, "health_failure_threshold": 100, "retry_jitter_factor": 1.0,
             "retry_backoff_multiplier": 10.0, "retry_max_retries": 2, "retry_initial_backoff_ms": U32,
             "retry_max_backoff_ms": U32,
             "request_timeout_secs": 365 * 24 * 3600, "health_check_port": 65535},
    "breaker on, least": {"circuit_breaker": True, "cb_failure_threshold": 1, "cb_success_threshold": 1,
                          "cb_timeout_duration_secs": 1},
    "breaker on, most": {"circuit_breaker": True, "cb_failure_threshold": U32, "cb_success_threshold": U32},
    "admission, least": {"prefill_max_inflight_requests_per_worker": 1, "prefill_queue_size": 0,
                         "prefill_queue_timeout_secs": 1},
    "admission, most": {"prefill_max_inflight_requests_per_worker": 2**31 - 1, "prefill_queue_size": U32,
                        "prefill_queue_timeout_secs": 1700},
}


@pytest.mark.parametrize("case", EDGES)
def test_smg_starts_with_every_edge_of_pdserves_ranges(smg_available, reference_data, tmp_path, case):
    settings = EDGES[case]
    try:
        args = _router_on_free_ports(reference_data, settings)
    except ConfigError as exc:
        pytest.fail(f"pdserve refused its own edge values: {[str(p) for p in exc.problems]}")
    verdict, said = _verdict(args, tmp_path / "router.log")
    assert verdict == "accepted", f"smg {verdict} {settings}: {said}"


# Values pdserve refuses (by field or by rule), spelled as flags after the rendered ones (argparse keeps the
# last): smg refuses each as well, so the schema is not narrower than it needs to be.
PAST = {
    "health-check-interval 0": (["--health-check-interval-secs", "0"], "health_check_interval_secs", 0),
    "health-failure-threshold 0": (["--health-failure-threshold", "0"], "health_failure_threshold", 0),
    "health-success-threshold 0": (["--health-success-threshold", "0"], "health_success_threshold", 0),
    "retries 0": (["--retry-max-retries", "0"], "retry_max_retries", 0),
    "initial backoff 0": (["--retry-initial-backoff-ms", "0"], "retry_initial_backoff_ms", 0),
    "multiplier below 1": (["--retry-backoff-multiplier", "0.99"], "retry_backoff_multiplier", 0.99),
    "multiplier inf": (["--retry-backoff-multiplier", "inf"], "retry_backoff_multiplier", float("inf")),
    "backoffs upside down": (["--retry-initial-backoff-ms", "500", "--retry-max-backoff-ms", "100"],
                             "retry_max_backoff_ms", None),
    "breaker threshold 0": (["--cb-failure-threshold", "0"], "cb_failure_threshold", 0),  # with the breaker on
    "queue without a limit": (["--prefill-queue-size", "5"], "prefill_queue_size", None),
    "request timeout 0": (["--request-timeout-secs", "0"], "request_timeout_secs", 0),
    "pool idle negative": (["--upstream-pool-idle-timeout-secs", "-1"], "upstream_pool_idle_timeout_secs", -1),
}


@pytest.mark.parametrize("case", PAST)
def test_what_pdserve_refuses_smg_refuses_too(smg_available, reference_data, tmp_path, case):
    flags, field, value = PAST[case]
    if value is not None:
        data = copy.deepcopy(reference_data)
        data["router"][field] = value
        with pytest.raises(ConfigError) as refused:
            deployment_from_data(data, "test")
        assert f"router.{field}" in {p.field for p in refused.value.problems}
    base = {"circuit_breaker": True, "cb_failure_threshold": 50} if field.startswith("cb_") else {}
    verdict, _said = _verdict([*_router_on_free_ports(reference_data, base), *flags], tmp_path / "router.log")
    # "exited": smg failed converting the value (a negative into an unsigned field) before its validation.
    assert verdict in {"refused", "exited"}, f"smg accepted {flags}"


def test_the_rules_refusals_are_smgs_own(smg_available, reference_data):
    """The two rules that mirror smg's start-up refusals say so, with the fix: held against smg's words above."""
    data = copy.deepcopy(reference_data)
    data["router"].update(retry_initial_backoff_ms=500, retry_max_backoff_ms=100, prefill_queue_size=5)
    with pytest.raises(ConfigError) as refused:
        deployment_from_data(data, "test")
    fields = {p.field: p for p in refused.value.problems}
    assert set(fields) == {"router.retry_max_backoff_ms", "router.prefill_queue_size"}
    assert all("smg refuses to start" in p.message for p in fields.values())


def test_pool_idle_zero_is_taken_by_smg_but_refused_by_pdserve(smg_available, reference_data, tmp_path):
    """smg reads 0 as "keep idle connections forever": it starts, but every connection then outlives the
    workers' keep-alive, the stale-reuse 500 the setting exists to prevent."""
    verdict, _ = _verdict([*_router_on_free_ports(reference_data, {}), "--upstream-pool-idle-timeout-secs", "0"],
                          tmp_path / "router.log")
    assert verdict == "accepted"
    data = copy.deepcopy(reference_data)
    data["router"]["upstream_pool_idle_timeout_secs"] = 0
    with pytest.raises(ConfigError):
        deployment_from_data(data, "test")
