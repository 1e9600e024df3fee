"""A Grafana dashboard (JSON model, schemaVersion 39) for one deployment: one page, a row per concern.

Queries use only the pinned SGLang's and router's (smg's) metrics (pdserve.render.monitoring.metrics) and
Grafana's `$__rate_interval`; the data source is the dashboard's `datasource` variable, so it imports
into any Grafana with a Prometheus data source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdserve.render.emit import prometheus
from pdserve.render.monitoring import metrics as m
from pdserve.schema.config import Deployment

RATE = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    # No series until the event it counts first happens (a refusal, a refused bootstrap port): an empty
    # panel line then means "none yet", and the live tests see these only with the fault that makes them.
    after_first_event: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    thresholds: tuple[float, ...] = field(default_factory=tuple)


def panels(dep: Deployment) -> list[Panel]:
    d = prometheus.matcher("deployment", dep.name)

    def quantiles(metric: str, by: str = "role", what: str = "") -> tuple[Query, ...]:
        """p50 and p99 of a histogram, per `by` label (the router has one series, so by nothing)."""
        group = f"sum by ({by}, le)" if by else "sum by (le)"
        legend = f"{{{{{by}}}}} " if by else f"{what} " if what else ""
        return tuple(Query(f"histogram_quantile({q}, {group} (rate({metric}_bucket{{{d}}}[{RATE}])))",
                           f"{legend}p{int(q * 100)}") for q in (0.5, 0.99))

    refused = prometheus.matcher("error_code", m.NO_WORKERS)
    probe = prometheus.matcher("phase", m.BOOTSTRAP_PROBE)
    opened = prometheus.matcher("to", m.BREAKER_OPEN)

    return [
        Panel("Time to first token", "s", quantiles(m.TTFT),
              f"{m.TTFT} per role; the alert bound is {dep.monitoring.ttft_p99_seconds:g} s (p99)",
              (dep.monitoring.ttft_p99_seconds,)),
        Panel("Inter-token latency", "s", quantiles(m.ITL), f"{m.ITL} per role"),
        Panel("Throughput", "none", (
            Query(f"sum by (role) (rate({m.GENERATION_TOKENS}{{{d}}}[{RATE}]))", "{{role}} generated tokens/s"),
            Query(f"sum by (role) (rate({m.PROMPT_TOKENS}{{{d}}}[{RATE}]))", "{{role}} prompt tokens/s"),
            Query(f"sum by (role) ({m.GEN_THROUGHPUT}{{{d}}})", "{{role}} as the scheduler logs it"),
        ), "tokens per second"),
        Panel("Running and queued requests", "none", (
            Query(f"sum by (role) ({m.RUNNING}{{{d}}})", "{{role}} running"),
            Query(f"sum by (role) ({m.QUEUED}{{{d}}})", "{{role}} queued"),
        ), f"{m.RUNNING}, {m.QUEUED}; the queue alert starts above {dep.monitoring.queue_max_requests}"),
        Panel("PD hand-off queues", "none", tuple(
            Query(f"sum by (role) ({name}{{{d}}})", f"{{{{role}}}} {name.split(':')[1].removeprefix('num_')}")
            for name in m.PD_QUEUES
        ), "Requests between the roles: the prefill's bootstrap and in-flight queues, the decode's prealloc "
           "(waiting for KV memory) and transfer (waiting for the KV) queues"),
        Panel("KV cache usage", "percentunit", (
            Query(f"max by (role) ({m.TOKEN_USAGE}{{{d}}})", "{{role}}"),
        ), f"{m.TOKEN_USAGE}; the alert threshold is {dep.monitoring.kv_usage_threshold:g}",
            (dep.monitoring.kv_usage_threshold,)),
        Panel("KV transfer latency", "ms", quantiles(m.KV_TRANSFER_LATENCY_MS),
              f"{m.KV_TRANSFER_LATENCY_MS}, observed by the prefill (the sender) in SGLang"),
        Panel("KV transfer failures", "none", (
            Query(f"sum by (role) (increase({m.TRANSFER_FAILED}{{{d}}}[{RATE}]))", "{{role}} failed in the interval"),
            # The counter's series starts at the first failure, which increase() cannot see: the total can.
            Query(f"sum by (role) ({m.TRANSFER_FAILED}{{{d}}})", "{{role}} failed since the server started"),
        ), f"{m.TRANSFER_FAILED}: no series until the first failure"),
        Panel("Router requests", "reqps", (
            Query(f"sum by (endpoint, streaming) (rate({m.ROUTER_REQUESTS}{{{d}}}[{RATE}]))",
                  "{{endpoint}} streaming={{streaming}}"),
            Query(f"sum by (status_code, error_code) (rate({m.ROUTER_HTTP_RESPONSES}{{{d}}}[{RATE}]))",
                  "HTTP {{status_code}} {{error_code}}"),
        ), f"{m.ROUTER_REQUESTS}, {m.ROUTER_HTTP_RESPONSES} (with the router's error_code)"),
        Panel("PD time to first token (router)", "s",
              quantiles(m.PD_TTFT, by="", what="first token") + quantiles(m.PD_PREFILL_DURATION, by="", what="prefill"),
              f"{m.PD_TTFT}: the router's dispatch to the prefill until the decode's first token, what a client "
              f"waits; {m.PD_PREFILL_DURATION}: the prefill leg alone. The alert bound is "
              f"{dep.monitoring.ttft_p99_seconds:g} s (p99)", (dep.monitoring.ttft_p99_seconds,)),
        Panel("Router refusals, breakers, bootstrap", "none", (
            Query(f"sum by (path) (rate({m.ROUTER_HTTP_RESPONSES}{{{d},{refused}}}[{RATE}]))",
                  f"503 {m.NO_WORKERS}/s {{{{path}}}}", after_first_event=True),
            Query(f"sum by (worker) (increase({m.BREAKER_TRANSITIONS}{{{d},{opened}}}[{RATE}]))",
                  "breaker opened {{worker}}"),
            Query(f"sum by (leg) ({m.PD_RENDEZVOUS_FAILURES}{{{d},{probe}}})",
                  "{{leg}} bootstrap port refused (since the router started)", after_first_event=True),
        ), f"Requests refused at once because no prefill/decode pair could serve ({m.ROUTER_HTTP_RESPONSES}"
           f"{{error_code=\"{m.NO_WORKERS}\"}}), circuit breakers opening ({m.BREAKER_TRANSITIONS}), and "
           f"bootstrap ports the router could not reach when it registered the prefill ({m.PD_RENDEZVOUS_FAILURES})"),
        Panel("Router errors and retries", "reqps", (
            Query(f"sum by (worker_type, error_type) (rate({m.ROUTER_WORKER_ERRORS}{{{d}}}[{RATE}]))",
                  "{{worker_type}} {{error_type}}"),
            Query(f"sum by (worker_type) (rate({m.ROUTER_WORKER_RETRIES}{{{d}}}[{RATE}]))", "{{worker_type}} retries"),
        ), f"{m.ROUTER_WORKER_ERRORS}, {m.ROUTER_WORKER_RETRIES}: worker errors the router saw and retried"),
        Panel("Router request latency", "s", quantiles(m.ROUTER_REQUEST_DURATION, by=""),
              f"{m.ROUTER_REQUEST_DURATION}: client-facing, end to end"),
        Panel("Workers and targets", "none", (
            Query(f"sum({m.ROUTER_WORKER_HEALTH}{{{d}}})", "healthy workers (router)"),
            Query(f"up{{{d}}}", "{{role}} up"),
        ), f"{m.ROUTER_WORKER_HEALTH} summed over workers; Prometheus' up per scraped role"),
        Panel("GPU memory held by SGLang", "decgbytes", tuple(
            Query(f"sum by (role) ({name}{{{d}}})",
                  f"{{{{role}}}} {name.split(':')[1].removesuffix('_memory_usage_gb')}")
            for name in m.GPU_MEMORY_PARTS_GB
        ), f"What SGLang allocated at start, summed over its ranks (weights, KV cache, CUDA graphs); "
           f"{m.GPU_MEMORY_EXPORTER}"),
    ]


def _panel_json(panel: Panel, number: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                                *({"color": "red", "value": v}
                                                                  for v in panel.thresholds)]}
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return {
        "id": number + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 8, "x": (number % 3) * 8, "y": (number // 3) * 8},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr,
                     "legendFormat": q.legend} for i, q in enumerate(panel.queries)],
    }


def dashboard(dep: Deployment) -> dict[str, Any]:
    return {
        "uid": f"pdserve-{dep.name}",
        "title": f"pdserve {dep.name}: SGLang prefill/decode",
        "tags": ["pdserve", "sglang"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "panels": [_panel_json(p, i) for i, p in enumerate(panels(dep))],
    }
