"""Monitoring for a deployment: the Prometheus scrape configuration, alert rules and a Grafana dashboard.

Pure functions of the deployment (its ports, name, boot layout and `monitoring` thresholds).
`monitoring_files` is what `pdserve render` writes under DIR/monitoring/ when monitoring.enable is set.
Prometheus reads YAML, and JSON is YAML: the .yml files are JSON, written by pdserve.render.emit.prometheus.
"""

from __future__ import annotations

from pdserve.render.emit.prometheus import document
from pdserve.render.monitoring.alerts import rule_groups
from pdserve.render.monitoring.dashboard import dashboard
from pdserve.render.monitoring.scrape import prometheus_config, scrape_configs
from pdserve.schema.config import Deployment

SUBDIR = "monitoring"
SCRAPE_FILE = "prometheus-scrape.yml"  # the scrape_configs list alone, for a Prometheus the host already has
PROMETHEUS_FILE = "prometheus.yml"  # a whole configuration around it, for a Prometheus of its own
ALERTS_FILE = "alerts.yml"
DASHBOARD_FILE = "dashboard.json"


def monitoring_files(dep: Deployment) -> dict[str, str]:
    """File name (under monitoring/) -> content."""
    made = f"Rendered by pdserve from deployment {dep.name!r}; JSON, which Prometheus reads as YAML."
    return {
        SCRAPE_FILE: document(scrape_configs(dep), made),
        PROMETHEUS_FILE: document(prometheus_config(dep, [ALERTS_FILE]), made),
        ALERTS_FILE: document(rule_groups(dep), made),
        DASHBOARD_FILE: document(dashboard(dep)),
    }
