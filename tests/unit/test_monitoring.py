"""The monitoring files pdserve renders: what Prometheus scrapes, what the rules and panels query, and that
both follow the deployment (pure functions; Prometheus itself runs in tests/integration/test_prometheus_*)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.monitoring import ALERTS_FILE, DASHBOARD_FILE, PROMETHEUS_FILE, SCRAPE_FILE, monitoring_files
from pdserve.render.monitoring import metrics as m
from pdserve.render.monitoring.alerts import alerts, rule_groups
from pdserve.render.monitoring.dashboard import dashboard, panels
from pdserve.render.monitoring.scrape import scrape_configs
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from tests.conftest import require_or_skip

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
    assert {"PdserveTargetDown", "PdserveRouterWorkersUnhealthy", "PdserveKVTransferFailures", "PdserveKVCacheFull",
            "PdserveQueueGrowing", "PdserveTTFTHigh", "PdserveWorkerRestarted", "PdserveRouterRestarted"} <= pd


def test_dashboard_is_one_grafana_page(reference):
    board = dashboard(reference)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) == len(panels(reference))
    assert board["templating"]["list"][0]["type"] == "datasource"
    titles = {p["title"] for p in board["panels"]}
    assert {"Time to first token", "Inter-token latency", "Throughput", "Running and queued requests",
            "KV cache usage", "KV transfer latency", "KV transfer failures", "Router requests",
            "Router errors and retries", "GPU memory held by SGLang"} <= titles
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
    args = ["--sglang-python", "/usr/bin/python3", "--numactl", "/usr/bin/numactl", "--pdserve", "/usr/bin/pdserve"]
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
