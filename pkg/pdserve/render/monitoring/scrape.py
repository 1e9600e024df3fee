"""The Prometheus scrape configuration (the `scrape_configs` list and a whole prometheus.yml around it)."""

from __future__ import annotations

from typing import Any

from pdserve.render.monitoring.targets import targets
from pdserve.schema.config import Deployment


def scrape_configs(dep: Deployment) -> list[dict[str, Any]]:
    interval = f"{dep.monitoring.scrape_interval_secs}s"
    return [{
        "job_name": t.job,
        "metrics_path": "/metrics",  # SGLang's and the router's, both open without the API key
        "scrape_interval": interval,
        "scrape_timeout": f"{min(dep.monitoring.scrape_interval_secs, 10)}s",
        "static_configs": [{"targets": [t.address], "labels": t.labels(dep)}],
    } for t in targets(dep)]


def prometheus_config(dep: Deployment, rule_files: list[str]) -> dict[str, Any]:
    """A complete prometheus.yml for a host that runs Prometheus for this deployment alone; a host with
    its own Prometheus takes `scrape_configs` and the rule file from it instead."""
    return {
        "global": {"scrape_interval": f"{dep.monitoring.scrape_interval_secs}s",
                   "evaluation_interval": f"{dep.monitoring.scrape_interval_secs}s"},
        "rule_files": rule_files,
        "scrape_configs": scrape_configs(dep),
    }
