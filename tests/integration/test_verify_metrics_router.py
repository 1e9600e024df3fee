"""`pdserve verify`'s metrics checks against the REAL router's (smg 1.13.0's) Prometheus listener in front of
two stand-in workers serving SGLang 0.5.23's metric families.

Healthy, every metrics check passes; each fault fails its check: KV transfers that fail on the decode
(the stand-in's kv_transfer_fails, counted as SGLang's decode counts them), a metrics port that does not
answer, a port that answers without the families, and a listener that does not count this router's traffic.
"""

from __future__ import annotations

import http.server
import re
import sys
import threading
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from pd_cluster import PDCluster, serving, write_deployment
from standin_sglang.launch import free_ports

from pdserve.verify.expect import expectations
from pdserve.verify.hosts import checks_for
from pdserve.verify.runner import Context, Options, run, select

pytestmark = pytest.mark.integration

METRICS_CHECKS = ("metrics.prefill", "metrics.decode", "metrics.router", "metrics.kv_transfer",
                  "metrics.router_requests")
E2E_REQUESTS = 4  # e2e.chat, e2e.reasoning, e2e.tools, e2e.stream: one request each


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pd-metrics")
    with serving(write_deployment(workdir), workdir) as c:
        yield c


@pytest.fixture
def healthy(cluster):
    with cluster.healthy():
        yield cluster


def verify(c: PDCluster, metrics_urls: dict[str, str] | None = None, only: tuple[str, ...] = ("e2e", "metrics"),
           chat_timeout: float = 30) -> dict[str, dict]:
    """The e2e and metrics checks, in the registry's order, with the run's own context (optionally with
    some roles' metrics URLs pointed elsewhere)."""
    exp = expectations(c.deployment)
    if metrics_urls:
        exp = replace(exp, metrics_urls={**exp.metrics_urls, **metrics_urls})
    checks = checks_for(exp)
    plan = select(list(checks), list(only), [])
    options = Options(probe_timeout=5, chat_timeout=chat_timeout)
    with httpx.Client(timeout=5) as client:
        results, errors = run(Context(c.deployment, exp, options, client), plan, checks)
    assert not errors, errors
    return {r.id: r.as_dict() for r in results if r.id.startswith(("e2e.", "metrics."))}


def statuses(checks: dict[str, dict]) -> dict[str, str]:
    return {i: checks[i]["status"] for i in METRICS_CHECKS}


def test_healthy_deployment_passes_every_metrics_check(healthy):
    checks = verify(healthy)
    assert all(checks[f"e2e.{k}"]["status"] == "pass" for k in ("chat", "reasoning", "tools", "stream")), checks
    assert statuses(checks) == dict.fromkeys(METRICS_CHECKS, "pass"), checks
    # Until a transfer fails, SGLang's counter has no series: the check says so rather than reading 0.
    assert "no series before or after" in checks["metrics.kv_transfer"]["observed"]
    assert f"for {E2E_REQUESTS} requests sent" in checks["metrics.router_requests"]["observed"]
    print("\n" + "\n".join(f"{i}: {checks[i]['observed']}" for i in METRICS_CHECKS))


def test_failing_kv_transfers_fail_the_transfer_check(healthy):
    """One request (the router retries it while the decode answers 500, each retry one more failure)."""
    healthy.set_faults("decode", faults=["kv_transfer_fails"])
    checks = verify(healthy, only=("e2e.chat", "metrics"), chat_timeout=10)
    result = checks["metrics.kv_transfer"]
    assert result["status"] == "fail", result
    increase = re.search(r"decode \+(\d+)", result["remediation"])
    assert increase and int(increase.group(1)) >= 1 and "bootstrap port" in result["remediation"], result
    assert "prefill: no series before or after" in result["observed"]
    # The endpoints still answer, and the router counted the request it failed to serve.
    assert {i: s for i, s in statuses(checks).items() if s != "pass"} == {"metrics.kv_transfer": "fail"}, checks
    assert checks["e2e.chat"]["status"] == "fail"
    print(f"\n{result['observed']}\n{checks['metrics.router_requests']['observed']}")


# The role whose metrics URL points at a port nothing answers on, the checks that then fail, and what they say
# (check, field, words).
DEAD_PORTS = [
    ("router", ["metrics.router", "metrics.router_requests"],
     [("metrics.router", "remediation", "prometheus_port"),
      ("metrics.router_requests", "observed", "no reading to compare")]),
    ("decode", ["metrics.decode", "metrics.kv_transfer"], [("metrics.decode", "observed", "no answer")]),
]


@pytest.mark.parametrize(("role", "failed", "says"), DEAD_PORTS, ids=["router", "worker"])
def test_a_metrics_port_that_does_not_answer_fails_its_checks(healthy, role, failed, says):
    (dead,) = free_ports(1)
    checks = verify(healthy, {role: f"http://127.0.0.1:{dead}/metrics"})
    assert {i: s for i, s in statuses(checks).items() if s != "pass"} == dict.fromkeys(failed, "fail"), checks
    for check, where, words in says:
        assert words in checks[check][where], checks[check]


def test_a_port_without_the_families_fails_its_endpoint_check(healthy):
    """The decode's metrics URL pointed at the router's listener: it answers, without SGLang's families."""
    router = expectations(healthy.deployment).metrics_urls["router"]
    checks = verify(healthy, {"decode": router})
    assert checks["metrics.decode"]["status"] == "fail", checks["metrics.decode"]
    assert "missing: sglang:num_running_reqs" in checks["metrics.decode"]["observed"]


class _Frozen(http.server.BaseHTTPRequestHandler):
    text = b""

    def do_GET(self) -> None:  # http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.text)))
        self.end_headers()
        self.wfile.write(self.text)

    def log_message(self, *_args) -> None:
        pass


def test_a_listener_that_does_not_count_this_routers_requests_fails_the_count(healthy):
    """Another process on router.prometheus_port: the real router's exposition, frozen at one moment."""
    router = expectations(healthy.deployment).metrics_urls["router"]
    _Frozen.text = httpx.get(router, timeout=5).content
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Frozen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        checks = verify(healthy, {"router": f"http://127.0.0.1:{server.server_port}/metrics"})
    finally:
        server.shutdown()
        server.server_close()
    assert {i: s for i, s in statuses(checks).items() if s != "pass"} == {"metrics.router_requests": "fail"}, checks
    assert "(+0)" in checks["metrics.router_requests"]["observed"]
