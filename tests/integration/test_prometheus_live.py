"""Debian's Prometheus, run with the configuration `pdserve render` writes, scrapes the REAL router
(smg 1.13.0) and two stand-in workers (serving SGLang 0.5.23's metric families) while requests flow through
the router. Every metric a rule or panel uses must be in that scrape, every panel's query must return a
series with a value, the rules must evaluate, the KV-transfer alert must fire on a real failure and the
router's worker count must drop when a worker stops, and its refusals (503 no_available_workers) show.

Needs `prometheus` on PATH (CI installs Debian's package and sets PDSERVE_REQUIRE_PROMETHEUS=1).
With PDSERVE_DASHBOARD_DATA=FILE the panels' range queries are also written to FILE as JSON (after
PDSERVE_DASHBOARD_SECONDS more seconds of traffic), which tests/integration/prometheus_dashboard_png.py
draws as docs/monitoring.md's dashboard picture.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from pd_cluster import PDCluster, wait_until, write_deployment
from standin_sglang.launch import free_ports

from pdserve.cli.main import main
from pdserve.render.argv import router_args
from pdserve.render.monitoring import PROMETHEUS_FILE, SUBDIR
from pdserve.render.monitoring import metrics as m
from pdserve.render.monitoring.alerts import alerts, rule_groups
from pdserve.render.monitoring.dashboard import dashboard, panels
from tests.conftest import require_or_skip

pytestmark = pytest.mark.integration

HTTP_TIMEOUT = 10.0
PROMETHEUS_START_TIMEOUT = 60.0
SERIES_TIMEOUT = 90.0  # scrapes every second; the slowest panel needs two samples after the first failure
RATE_WINDOW = "1m"  # what Grafana's $__rate_interval stands for in these queries
METRIC_NAME = re.compile(r"\b(?:sglang:[a-z_]+|smg_[a-z_]+)")
# Needs a router whose prefill bootstrap port refuses, which this cluster is not:
# tests/integration/test_router_metrics_smg.py starts one and finds it in the real router's scrape.
NOT_IN_THIS_CLUSTER = {m.PD_RENDEZVOUS_FAILURES}


def _chat(client: httpx.Client, router: str, stream: bool = False) -> int:
    body = {"model": "standin", "stream": stream, "max_tokens": 8,
            "messages": [{"role": "user", "content": "how are the prefill and the decode today"}]}
    try:
        return client.post(f"{router}/v1/chat/completions", json=body).status_code
    except httpx.HTTPError:
        return 0


class Traffic:
    """Requests through the router, a few per second, until stopped (rates need fresh samples)."""

    def __init__(self, router: str) -> None:
        self.router, self.sent, self.ok = router, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=HTTP_TIMEOUT) as client:
            while not self._stop.is_set():
                status = _chat(client, self.router, stream=self.sent % 2 == 1)
                self.sent += 1
                self.ok += status == 200
                self._stop.wait(0.25)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * HTTP_TIMEOUT)


class Prometheus:
    def __init__(self, binary: str, config: Path, workdir: Path) -> None:
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        self.client = httpx.Client(timeout=HTTP_TIMEOUT)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return self.client.get(f"{self.url}/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def api(self, path: str, **params) -> dict:
        response = self.client.get(f"{self.url}/api/v1/{path}", params=params)
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    binary = shutil.which("prometheus")
    require_or_skip(binary is not None, "prometheus not installed (apt-get install prometheus)",
                    "PDSERVE_REQUIRE_PROMETHEUS")
    work = tmp_path_factory.mktemp("prometheus-live")
    config = write_deployment(work)
    with config.open("a", encoding="utf-8") as handle:
        handle.write("\n[monitoring]\nenable = true\nscrape_interval_secs = 1\n")
    rendered = work / "rendered"
    result = CliRunner().invoke(main, ["render", "-c", str(config), "--out", str(rendered), "--sglang-python",
                                       sys.executable, "--numactl", "/usr/bin/numactl",
                                       "--pdserve", "/usr/bin/pdserve"])
    assert result.exit_code == 0, result.output
    cluster = PDCluster(config, work)
    prometheus = None
    try:
        cluster.serve()
        prometheus = Prometheus(binary, rendered / SUBDIR / PROMETHEUS_FILE, work)
        assert wait_until(prometheus.ready, PROMETHEUS_START_TIMEOUT, 0.5), prometheus.log.read_text()[-2000:]
        # Counters must have a sample from before the failure, or increase() cannot see it (as in production,
        # where Prometheus scrapes long before).
        pd_up = 'count(up{role=~"prefill|decode|router"} == 1)'
        assert wait_until(lambda: [r["value"][1] for r in prometheus.query(pd_up)] == ["3"], SERIES_TIMEOUT, 0.5)
        started = time.time()
        with Traffic(cluster.url("router")) as traffic:
            _one_failed_transfer(cluster)
            yield {"cluster": cluster, "prometheus": prometheus, "traffic": traffic, "started": started}
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def _one_failed_transfer(cluster: PDCluster) -> None:
    """A request through the router while the decode fails every KV hand-off: SGLang's failure counter
    and the router's error and retry counters see it; the router's retries succeed once it is lifted."""
    cluster.set_faults("decode", faults=["kv_transfer_fails"])
    try:
        with httpx.Client(timeout=3.0) as client:
            _chat(client, cluster.url("router"))
    finally:
        cluster.set_faults("decode", faults=[])


def _panel_exprs(dep, with_event_only: bool = True) -> list[str]:
    """Every panel query; without those that have no series before their event (a refusal, a refused
    bootstrap port) if `with_event_only` is False."""
    return [q.expr for p in panels(dep) for q in p.queries if with_event_only or not q.after_first_event]


def _used_names(dep) -> set[str]:
    text = json.dumps([a.expr for a in alerts(dep)]) + json.dumps(_panel_exprs(dep))
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in METRIC_NAME.findall(text)}


def test_prometheus_scrapes_every_running_role(live):
    prometheus, dep = live["prometheus"], live["cluster"].deployment

    def health() -> dict[str, str]:
        return {t["labels"]["role"]: t["health"] for t in prometheus.api("targets")["activeTargets"]
                if t["labels"].get("deployment") == dep.name}

    assert wait_until(lambda: health() == {"prefill": "up", "decode": "up", "router": "up", "fallback": "down"},
                      SERIES_TIMEOUT, 0.5), health()


def test_every_metric_the_rules_and_panels_use_is_in_the_live_scrape(live):
    prometheus = live["prometheus"]
    used = _used_names(live["cluster"].deployment) - NOT_IN_THIS_CLUSTER

    def missing() -> set[str]:
        names = set(prometheus.api("label/__name__/values"))
        return {n for n in used if n not in names and f"{n}_bucket" not in names}

    assert used and wait_until(lambda: not missing(), SERIES_TIMEOUT, 1.0), \
        f"not scraped from the real router or the stand-ins: {sorted(missing())}"


def _panel_results(prometheus: Prometheus, dep) -> dict[str, list[dict]]:
    return {expr: prometheus.query(expr.replace("$__rate_interval", RATE_WINDOW))
            for expr in _panel_exprs(dep, with_event_only=False)}


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def test_every_panel_query_returns_a_series(live):
    prometheus = live["prometheus"]
    results: dict[str, list[dict]] = {}

    def all_answer() -> bool:
        results.update(_panel_results(prometheus, live["cluster"].deployment))
        return all(_finite(r) for r in results.values())

    ok = wait_until(all_answer, SERIES_TIMEOUT, 1.0)
    empty = [expr for expr, r in results.items() if not _finite(r)]
    assert ok, f"panel queries without a finite value: {empty}"
    print(f"\n{len(results)} panel queries, each with a series: "
          f"{sum(len(r) for r in results.values())} series in all; traffic {live['traffic'].ok}/"
          f"{live['traffic'].sent} requests answered 200")
    if os.environ.get("PDSERVE_DASHBOARD_DATA"):
        # A longer run for the picture than the test needs (PDSERVE_DASHBOARD_SECONDS, default 0).
        time.sleep(float(os.environ.get("PDSERVE_DASHBOARD_SECONDS", "0")))
        _write_dashboard_data(live, Path(os.environ["PDSERVE_DASHBOARD_DATA"]))


def test_rules_evaluate_and_the_transfer_failure_fires(live):
    prometheus, dep = live["prometheus"], live["cluster"].deployment
    expected = {rule["alert"] for rule in rule_groups(dep)["groups"][0]["rules"]}

    def rules() -> dict[str, dict]:
        return {r["name"]: r for g in prometheus.api("rules")["groups"] for r in g["rules"]}

    assert wait_until(lambda: set(rules()) == expected and all(r.get("lastEvaluation", "").startswith("20")
                                                               for r in rules().values()), SERIES_TIMEOUT, 0.5)
    assert {name: r["health"] for name, r in rules().items()} == dict.fromkeys(expected, "ok"), \
        {name: r.get("lastError") for name, r in rules().items()}

    def active() -> dict[str, str]:
        return {a["labels"]["alertname"]: a["state"] for a in prometheus.api("alerts")["alerts"]}

    assert wait_until(lambda: active().get("PdserveKVTransferFailures") == "firing", SERIES_TIMEOUT, 0.5), active()
    firing = next(a for a in prometheus.api("alerts")["alerts"]
                  if a["labels"]["alertname"] == "PdserveKVTransferFailures")
    assert firing["labels"]["role"] == "decode" and firing["labels"]["deployment"] == dep.name
    # Nothing else is wrong with this cluster. With the router's circuit breaker on, the failed hand-off's
    # attempts open both breakers, and the router refuses for as long as they stay open: the breaker alert
    # fires, the refusing one may wait (it needs 2 minutes of refusals), nothing else.
    breaker_on = "--disable-circuit-breaker" not in router_args(dep)
    allowed = {"PdserveKVTransferFailures": {"firing"}}
    if breaker_on:
        allowed |= {"PdserveRouterBreakerOpened": {"firing"}, "PdserveRouterRefusing": {"pending"}}
    assert all(allowed.get(name) and state in allowed[name] for name, state in active().items()), active()
    assert ("PdserveRouterBreakerOpened" in active()) == breaker_on, active()


def test_a_stopped_worker_is_seen_down_by_prometheus_and_by_the_router(live):
    """Last: it stops the decode. The router's smg_worker_health drops it, and Prometheus' up does."""
    cluster, prometheus = live["cluster"], live["prometheus"]
    by_name = {a.name: a.expr for a in alerts(cluster.deployment)}
    unhealthy = by_name["PdserveRouterWorkersUnhealthy"]
    down = by_name["PdserveTargetDown"]
    assert prometheus.query(unhealthy) == [] and prometheus.query(down) == []
    cluster.stop_role("decode")
    assert wait_until(lambda: [float(r["value"][1]) for r in prometheus.query(unhealthy)] == [1.0],
                      SERIES_TIMEOUT, 0.5), prometheus.query(unhealthy)
    assert wait_until(lambda: [r["metric"]["role"] for r in prometheus.query(down)] == ["decode"],
                      SERIES_TIMEOUT, 0.5), prometheus.query(down)
    # The traffic goes on: smg answers it 503 no_available_workers, which the refusing alert counts (it
    # fires after 2 minutes of it, longer than this test waits).
    refusing = by_name["PdserveRouterRefusing"].split(" > ")[0]
    assert wait_until(lambda: [float(r["value"][1]) > 0 for r in prometheus.query(refusing)] == [True],
                      SERIES_TIMEOUT, 0.5), prometheus.query(refusing)


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def _write_dashboard_data(live, path: Path) -> None:
    """Every panel's queries over the run so far (range queries, 1 s steps), for docs/monitoring.md's picture."""
    prometheus, dep = live["prometheus"], live["cluster"].deployment
    end = time.time()
    board = dashboard(dep)
    panels = []
    for panel in board["panels"]:
        series = []
        for target in panel["targets"]:
            data = prometheus.api("query_range", query=target["expr"].replace("$__rate_interval", RATE_WINDOW),
                                  start=live["started"], end=end, step="1")
            series += [{"legend": _legend(target["legendFormat"], r["metric"]),
                        "points": [[float(t) - live["started"], float(v)] for t, v in r["values"]]}
                       for r in data["result"]]
        panels.append({"title": panel["title"], "unit": panel["fieldConfig"]["defaults"]["unit"],
                       "gridPos": panel["gridPos"], "series": series})
    path.write_text(json.dumps({"title": board["title"], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(end)),
                                "seconds": end - live["started"], "panels": panels}, indent=1))
