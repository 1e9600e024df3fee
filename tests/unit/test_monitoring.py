"""The monitoring files pdserve renders: what Prometheus scrapes, what the rules and panels query, and that
both follow the deployment (pure functions; Prometheus itself runs in tests/integration/test_prometheus_*)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.probes.metrics import parse
from pdserve.render.monitoring import ALERTS_FILE, DASHBOARD_FILE, PROMETHEUS_FILE, SCRAPE_FILE, monitoring_files
from pdserve.render.monitoring import metrics as m
from pdserve.render.monitoring.alerts import alerts, rule_groups
from pdserve.render.monitoring.dashboard import dashboard, panels
from pdserve.render.monitoring.scrape import scrape_configs
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from pdserve.verify.checks import metrics as verify_metrics
from tests.conftest import require_or_skip
from tests.fixtures.promql_refs import Ref, problems, refs
from tests.fixtures.smg_exposition import PHASES, families, merged, recorded

SGLANG_METRIC = re.compile(r"sglang:[a-z_]+")
ROUTER_METRIC = re.compile(r"\bsmg_[a-z_]+")


def _dep(data, **monitoring):
    data["monitoring"] = {"enable": True, **monitoring}
    return deployment_from_data(data, "<test>").deployment


def test_scrape_jobs_follow_the_deployment(reference_data):
    reference_data["router"]["prometheus_host"] = "0.0.0.0"
    dep = _dep(reference_data, scrape_interval_secs=5)
    jobs = {job["job_name"]: job for job in scrape_configs(dep)}
    assert set(jobs) == {f"pdserve-dsv4-{role}" for role in ("prefill", "decode", "router", "fallback")}
    where = {name: job["static_configs"][0]["targets"] for name, job in jobs.items()}
    # The router's Prometheus listener (bound to every address: scraped on loopback), not its API port.
    assert where["pdserve-dsv4-router"] == [f"127.0.0.1:{dep.router.prometheus_port}"]
    assert where["pdserve-dsv4-prefill"] == [f"127.0.0.1:{dep.prefill.port}"]
    assert where["pdserve-dsv4-decode"] == [f"127.0.0.1:{dep.decode.port}"]
    assert where["pdserve-dsv4-fallback"] == [f"127.0.0.1:{dep.fallback_port}"]
    for name, job in jobs.items():
        assert job["static_configs"][0]["labels"] == {"deployment": "dsv4", "role": name.rsplit("-", 1)[1]}
        assert job["scrape_interval"] == "5s" and job["scrape_timeout"] == "5s"


def test_rules_carry_the_deployments_thresholds(reference_data):
    dep = _dep(reference_data, ttft_p99_seconds=4.5, kv_usage_threshold=0.7, queue_max_requests=9)
    exprs = {a.name: a.expr for a in alerts(dep)}
    assert exprs["PdserveTTFTHigh"].endswith("> 4.5")
    assert exprs["PdserveKVCacheFull"].endswith("> 0.7")
    assert "> 9 and" in exprs["PdserveQueueGrowing"]
    assert all('deployment="dsv4"' in expr for expr in exprs.values())
    group = rule_groups(dep)["groups"][0]
    assert group["interval"] == f"{dep.monitoring.scrape_interval_secs}s"
    assert all(rule["labels"]["deployment"] == "dsv4" for rule in group["rules"])


def test_the_fallback_alerts_only_where_it_boots(reference_data):
    pd = {a.name for a in alerts(_dep(reference_data))}
    reference_data["boot_layout"] = "single"
    single = {a.name for a in alerts(_dep(reference_data))}
    assert single - pd == {"PdserveFallbackDown"} and "PdserveFallbackDown" not in pd
    assert {"PdserveTargetDown", "PdserveRouterWorkersUnhealthy", "PdserveRouterRefusing",
            "PdserveRouterBootstrapRefused", "PdserveRouterBreakerOpened", "PdserveKVTransferFailures",
            "PdserveKVCacheFull", "PdserveQueueGrowing", "PdserveTTFTHigh", "PdserveWorkerRestarted",
            "PdserveRouterRestarted"} <= pd


def test_dashboard_is_one_grafana_page(reference):
    board = dashboard(reference)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) == len(panels(reference))
    assert board["templating"]["list"][0]["type"] == "datasource"
    titles = {p["title"] for p in board["panels"]}
    assert {"Time to first token", "Inter-token latency", "Throughput", "Running and queued requests",
            "KV cache usage", "KV transfer latency", "KV transfer failures", "Router requests",
            "Router errors and retries", "PD time to first token (router)", "Router refusals, breakers, bootstrap",
            "GPU memory held by SGLang"} <= titles
    for panel in board["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    gpu = next(p for p in board["panels"] if p["title"] == "GPU memory held by SGLang")
    assert "dcgm-exporter" in gpu["description"]


def _used_names(dep) -> set[str]:
    text = json.dumps(rule_groups(dep)) + json.dumps(dashboard(dep))
    return set(SGLANG_METRIC.findall(text)) | set(ROUTER_METRIC.findall(text))


def test_every_sglang_metric_used_is_one_the_pinned_sglang_defines(reference):
    """Each sglang:* name in a rule or panel is declared (name="...") in the installed SGLang's source."""
    try:
        import sglang
    except ImportError:
        sglang = None
    require_or_skip(sglang is not None, "sglang is not installed in this Python", "PDSERVE_REQUIRE_PARSERS")
    root = Path(sglang.__file__).parent / "srt" / "observability"
    declared = set(re.findall(r'name="(sglang:[a-z_]+)"', "".join(p.read_text() for p in root.glob("*.py"))))
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in _used_names(reference) if n.startswith("sglang:")}
    assert used and used <= declared, f"not in SGLang's source: {sorted(used - declared)}"


def test_every_router_metric_used_is_in_the_router_binary(reference):
    """Each smg_* name is a string in the router's (smg's) Rust binary (the live scrape checks they appear)."""
    try:
        import smg
    except ImportError:
        smg = None
    require_or_skip(smg is not None, "smg is not installed in this Python", "PDSERVE_REQUIRE_PARSERS")
    binary = b"".join(p.read_bytes() for p in Path(smg.__file__).parent.glob("*.so"))
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in _used_names(reference) if n.startswith("smg_")}
    assert used and all(name.encode() in binary for name in used)


def router_refs(dep) -> list[Ref]:
    """Every smg_* family, label and value pdserve reads: in the rules, the panels and `pdserve verify`."""
    exprs = [a.expr for a in alerts(dep)] + [t["expr"] for p in dashboard(dep)["panels"] for t in p["targets"]]
    found = [ref for expr in exprs for ref in refs(expr, "smg_")]
    found += [Ref(name) for name in verify_metrics.ROUTER_FAMILIES]
    found += [Ref(m.ROUTER_REQUESTS), Ref(m.ROUTER_HTTP_REQUESTS, {"path"}, [("path", "=", verify_metrics.CHAT_PATH)])]
    return found


def test_every_router_metric_label_and_value_read_is_one_smg_exposes(reference):
    """Against what the real smg 1.13.0 exposed while it served, failed and refused (recorded by
    tests/fixtures/smg_exposition.py; tests/integration/test_router_metrics_smg.py checks the live binary)."""
    exposed = merged(*(recorded(phase) for phase in PHASES))
    found = router_refs(reference)
    assert {ref.family for ref in found} >= {m.PD_TTFT, m.PD_PREFILL_DURATION, m.PD_RENDEZVOUS_FAILURES,
                                             m.BREAKER_TRANSITIONS, m.ROUTER_HTTP_RESPONSES}
    wrong = [problem for ref in found for problem in problems(ref, exposed)]
    assert not wrong, wrong


@pytest.mark.parametrize("expr, problem", [
    ('smg_pd_ttft{deployment="x"}', "smg_pd_ttft: no such family"),  # the name the facts give, not the exposed one
    ('sum by (code) (smg_http_responses_total{deployment="x"})', "no label 'code'"),
    ('smg_http_responses_total{error_code="server_selection_failed"}', "matches none of"),  # 0.3.2's code
    ('increase(smg_worker_retries_exhausted_total{reason="x"}[5m])', "no label 'reason'"),
    ('sum by (worker, le) (rate(smg_pd_prefill_duration_seconds_bucket[1m]))', "no label 'worker'"),
    ('smg_worker_cb_transitions_total{to=~"opened|tripped"}', "matches none of"),
])
def test_the_router_name_check_fails_on_what_smg_does_not_expose(expr, problem):
    exposed = merged(*(recorded(phase) for phase in PHASES))
    found = [p for ref in refs(expr, "smg_") for p in problems(ref, exposed)]
    assert any(problem in p for p in found), found


def test_the_reader_gives_a_by_clause_only_to_its_own_argument():
    expr = ('sum by (worker) (smg_worker_health{a="x"}) + on() group_left sum(smg_http_requests_total{b=~"y|z"}) '
            'or histogram_quantile(0.9, sum by (le) (rate(smg_pd_ttft_seconds_bucket[1m])))')
    read = {ref.family: (ref.labels, ref.matched) for ref in refs(expr, "smg_")}
    assert read == {"smg_worker_health": ({"worker", "a"}, [("a", "=", "x")]),
                    "smg_http_requests_total": ({"b"}, [("b", "=~", "y|z")]),
                    "smg_pd_ttft_seconds": ({"le"}, [])}
    with pytest.raises(ValueError, match="not read here"):
        refs("sum(smg_worker_health) by (worker)", "smg_")


def test_verify_requires_only_router_families_an_idle_smg_has_series_of():
    """Idle: nothing asked on its main port, readiness asked on --health-check-port (smg's HTTP counters are
    not there yet, so requiring smg_http_requests_total would fail a healthy router)."""
    idle = families(recorded("idle_health_port"))
    assert set(verify_metrics.ROUTER_FAMILIES) <= set(idle), set(verify_metrics.ROUTER_FAMILIES) - set(idle)
    assert m.ROUTER_HTTP_REQUESTS not in idle


def test_router_refusals_are_read_from_the_503_code_not_the_retry_counters(reference):
    """smg answers 503 no_available_workers at once in an outage; its retries-exhausted counter stays 0."""
    faults = families(recorded("faults"))
    assert m.NO_WORKERS in faults[m.ROUTER_HTTP_RESPONSES]["error_code"]
    stayed = [s for s in parse("recorded", recorded("faults")).samples
              if s.name == "smg_worker_retries_exhausted_total" and s.value]
    assert stayed == []
    refusing = next(a for a in alerts(reference) if a.name == "PdserveRouterRefusing")
    assert f'error_code="{m.NO_WORKERS}"' in refusing.expr and "retries" not in refusing.expr


def test_metric_names_live_in_one_module(reference):
    """Rules and panels name metrics only through pdserve.render.monitoring.metrics."""
    known = {v for v in vars(m).values() if isinstance(v, str)} | set(m.GPU_MEMORY_PARTS_GB) | set(m.PD_QUEUES)
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in _used_names(reference)}
    assert used <= known, sorted(used - known)


@pytest.mark.parametrize("field, value", [("kv_usage_threshold", 1.5), ("ttft_p99_seconds", 0),
                                          ("scrape_interval_secs", "15s"), ("queue_max_requests", -1)])
def test_bad_thresholds_name_the_field(reference_data, field, value):
    reference_data["monitoring"] = {"enable": True, field: value}
    with pytest.raises(ConfigError) as raised:
        deployment_from_data(reference_data, "<test>")
    assert any(f"monitoring.{field}" in str(p) for p in raised.value.problems), raised.value.problems


def test_render_writes_the_monitoring_files_only_when_enabled(reference_data, tmp_path):
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(reference_data))
    off = tmp_path / "off"
    args = ["--sglang-python", "/usr/bin/python3", "--numactl", "/usr/bin/numactl", "--pdserve", "/usr/bin/pdserve",
            "--no-python-check"]
    result = CliRunner().invoke(main, ["render", "-c", str(config), "--out", str(off), *args])
    assert result.exit_code == 0, result.output
    assert not (off / "monitoring").exists()

    reference_data["monitoring"] = {"enable": True}
    config.write_text(json.dumps(reference_data))
    on = tmp_path / "on"
    result = CliRunner().invoke(main, ["render", "-c", str(config), "--out", str(on), *args])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (on / "monitoring").iterdir())
    assert written == sorted([SCRAPE_FILE, PROMETHEUS_FILE, ALERTS_FILE, DASHBOARD_FILE])
    dep = deployment_from_data(reference_data, "<test>").deployment
    for name, text in monitoring_files(dep).items():
        assert (on / "monitoring" / name).read_text() == text
        json.loads(text.split("\n", 1)[1] if text.startswith("#") else text)  # JSON, hence YAML
    assert not list(on.rglob(".*.pdserve-tmp"))
