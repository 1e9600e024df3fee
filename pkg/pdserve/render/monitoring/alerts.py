"""Prometheus alert rules for one deployment, from its own thresholds (deployment.monitoring).

Every expression selects `deployment="<name>"` (pdserve.render.emit.prometheus.matcher), the label the scrape
configuration puts on each target, so several deployments can share one Prometheus. Annotations use only
`$labels`, never `$value`: what a rule says is fixed by the deployment, and the rule tests compare it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdserve.render.emit import prometheus
from pdserve.render.monitoring import metrics as m
from pdserve.schema.config import WORKER_ROLES, Deployment


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def as_rule(self, dep: Deployment) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        # Prometheus expands templates in alert labels too: the name goes in as text.
        rule["labels"] = {"severity": self.severity, "deployment": prometheus.template_text(dep.name)}
        rule["annotations"] = {"summary": self.summary, "description": self.description}
        return rule


def alerts(dep: Deployment) -> list[Alert]:
    d = prometheus.matcher("deployment", dep.name)
    # Annotations are Go templates: the name goes in as text, never as template code.
    name = prometheus.template_text(dep.name)
    mon = dep.monitoring
    workers = len(WORKER_ROLES)  # one prefill and one decode: what pdserve configures the router with
    unit = f"sglang-{name}-{{{{ $labels.role }}}}"
    refused = prometheus.matcher("error_code", m.NO_WORKERS)
    probe = prometheus.matcher("phase", m.BOOTSTRAP_PROBE)
    opened = prometheus.matcher("to", m.BREAKER_OPEN)
    fallback = prometheus.matcher("role", "fallback")

    def p99_above(histogram: str, selector: str) -> str:
        return (f"histogram_quantile(0.99, sum by (deployment, role, le) (rate({histogram}_bucket{{{selector}}}[5m]))) "
                f"> {mon.ttft_p99_seconds:g}")
    found = [
        Alert(
            "PdserveTargetDown",
            f'up{{{d},role=~"prefill|decode|router"}} == 0 unless on(deployment) (up{{{d},role="fallback"}} == 1)',
            "1m", "critical",
            f"{name}: the {{{{ $labels.role }}}} does not answer /metrics",
            f"Prometheus cannot scrape {{{{ $labels.instance }}}} ({unit}) and the fallback does not serve "
            f"instead. Look at `systemctl status {unit}` and `journalctl -u {unit}`."),
        Alert(
            "PdserveRouterWorkersUnhealthy",
            f"(sum by (deployment) ({m.ROUTER_WORKER_HEALTH}{{{d}}}) or on() vector(0)) < {workers} "
            f'and on() (up{{{d},role="router"}} == 1)',
            "1m", "critical",
            f"{name}: the router counts fewer than {workers} healthy workers",
            f"The router reports fewer healthy workers ({m.ROUTER_WORKER_HEALTH}) than the {workers} it was "
            f"started with (prefill and decode); requests fail or wait. Run `pdserve verify` and read "
            f"`journalctl -u sglang-{name}-prefill -u sglang-{name}-decode`."),
        Alert(
            "PdserveRouterRefusing",
            # smg answers 503 at once when no prefill/decode pair can serve (a role down, or its breaker
            # open); its retry counters do not move then. The first refusals create the series, which
            # increase() cannot see: a refusal that goes on is what this is for, and it keeps counting.
            f"sum by (deployment) (increase({m.ROUTER_HTTP_RESPONSES}{{{d},{refused}}}[1m])) > 0",
            "2m", "critical",
            f"{name}: the router refuses requests: no prefill/decode pair can serve",
            f"For over 2 minutes the router answered 503 {m.NO_WORKERS} "
            f"({m.ROUTER_HTTP_RESPONSES}{{error_code=\"{m.NO_WORKERS}\"}}): a role is down or not ready, or its "
            f"circuit breaker is open. A restart takes about a minute; longer is an outage. Run `pdserve verify` "
            f"and read `journalctl -u sglang-{name}-prefill -u sglang-{name}-decode -u sglang-{name}-router`."),
        Alert(
            "PdserveRouterBootstrapRefused",
            # Counted once, when the router registers the prefill (at its start); the series appears then.
            f"sum by (deployment, leg) (increase({m.PD_RENDEZVOUS_FAILURES}{{{d},{probe}}}[30m])) > 0 "
            f"or sum by (deployment, leg) ({m.PD_RENDEZVOUS_FAILURES}{{{d},{probe}}} "
            f"unless {m.PD_RENDEZVOUS_FAILURES}{{{d},{probe}}} offset 30m)",
            "0m", "warning",
            f"{name}: the router could not reach the {{{{ $labels.leg }}}}'s bootstrap port",
            f"When the router registered the {{{{ $labels.leg }}}} ({m.PD_RENDEZVOUS_FAILURES}, "
            f"phase=\"{m.BOOTSTRAP_PROBE}\"), nothing accepted a connection on its bootstrap port "
            f"{dep.transfer.bootstrap_port}: the decode cannot fetch KV caches there, and requests fail or wait. "
            f"Check `ss -ltnp` for the port and `journalctl -u sglang-{name}-prefill`; the router probes only "
            f"when it registers a worker: restart sglang-{name}-router once the port listens."),
        Alert(
            "PdserveRouterBreakerOpened",
            # The transition counters exist from start at 0 for every worker, so increase() sees the first.
            f"sum by (deployment, worker) (increase({m.BREAKER_TRANSITIONS}{{{d},{opened}}}[5m])) > 0",
            "0m", "warning",
            f"{name}: the router's circuit breaker opened for {{{{ $labels.worker }}}}",
            f"{m.BREAKER_TRANSITIONS}{{to=\"{m.BREAKER_OPEN}\"}} rose in the last 5 minutes: the router stopped "
            f"sending to {{{{ $labels.worker }}}} after failed requests and answers 503 {m.NO_WORKERS} while no "
            f"pair is left. In PD mode both legs are charged with every failed attempt, so a few failed "
            f"requests open both breakers: expected while a role restarts; with every role up, requests failed. "
            f"Read `journalctl -u sglang-{name}-router`."),
        Alert(
            "PdserveKVTransferFailures",
            # increase() needs two samples of a series, and SGLang's counter has no series before its first
            # failure: the second part catches a counter that did not exist 5 minutes ago.
            f"sum by (deployment, role) (increase({m.TRANSFER_FAILED}{{{d}}}[5m])) > 0 "
            f"or sum by (deployment, role) ({m.TRANSFER_FAILED}{{{d}}} unless {m.TRANSFER_FAILED}{{{d}}} offset 5m)",
            "0m", "warning",
            f"{name}: KV transfers fail on the {{{{ $labels.role }}}}",
            f"{m.TRANSFER_FAILED} rose in the last 5 minutes: KV caches did not reach the decode and those "
            f"requests failed. Check the transfer backend ({dep.transfer.backend}) and the prefill's bootstrap "
            f"port {dep.transfer.bootstrap_port} in `journalctl -u {unit}`."),
        Alert(
            "PdserveKVCacheFull",
            f"max by (deployment, role) ({m.TOKEN_USAGE}{{{d}}}) > {mon.kv_usage_threshold:g}",
            "5m", "warning",
            f"{name}: the {{{{ $labels.role }}}}'s KV cache is over {mon.kv_usage_threshold:.0%} full",
            f"{m.TOKEN_USAGE} stayed above monitoring.kv_usage_threshold ({mon.kv_usage_threshold:g}) for "
            f"5 minutes: new requests queue or are retracted. Lower max_running_requests or give the role "
            f"more memory (mem_fraction_static)."),
        Alert(
            "PdserveQueueGrowing",
            f"sum by (deployment, role) ({m.QUEUED}{{{d}}}) > {mon.queue_max_requests} "
            f"and sum by (deployment, role) (deriv({m.QUEUED}{{{d}}}[10m])) > 0",
            "5m", "warning",
            f"{name}: requests pile up in the {{{{ $labels.role }}}}'s queue",
            f"More than monitoring.queue_max_requests ({mon.queue_max_requests}) requests wait "
            f"({m.QUEUED}) and the queue kept growing over 10 minutes: the {{{{ $labels.role }}}} cannot keep "
            f"up with the load."),
        Alert(
            "PdserveTTFTHigh",
            # What a client waits for its first token: the router's PD view (both legs, which neither server
            # sees alone), or the fallback's own while it serves instead.
            f"{p99_above(m.PD_TTFT, d)} or {p99_above(m.TTFT, f'{d},{fallback}')}",
            "10m", "warning",
            f"{name}: p99 time to first token through the {{{{ $labels.role }}}} is over "
            f"{mon.ttft_p99_seconds:g} s",
            f"The 99th percentile of the time to first token ({m.PD_TTFT} on the router: prefill dispatch to the "
            f"decode's first token; {m.TTFT} on the fallback) stayed above monitoring.ttft_p99_seconds "
            f"({mon.ttft_p99_seconds:g} s) for 10 minutes."),
        Alert(
            "PdserveWorkerRestarted",
            # SGLang exports no process_start_time_seconds (its registry is the multiprocess collector
            # alone); startup_time_seconds is set once per start from measured durations, so it changes.
            f'changes({m.STARTUP_TIME}{{{d},phase="{m.STARTUP_PHASE}"}}[30m]) > 0',
            "0m", "warning",
            f"{name}: the {{{{ $labels.role }}}} restarted",
            f"{m.STARTUP_TIME}{{phase=\"{m.STARTUP_PHASE}\"}} changed within 30 minutes: SGLang started again "
            f"(a crash and systemd's Restart=, or a restart by hand). Read `journalctl -u {unit}`."),
        Alert(
            "PdserveRouterRestarted",
            # The router exports no start time either; its health-check counter grows every
            # --health-check-interval-secs and starts again from zero when the process does.
            f'resets({m.ROUTER_HEALTH_CHECKS}{{{d},role="router",result="success"}}[30m]) > 0',
            "0m", "warning",
            f"{name}: the router restarted",
            f"{m.ROUTER_HEALTH_CHECKS} went back to zero within 30 minutes: the router started again. "
            f"Read `journalctl -u sglang-{name}-router`."),
    ]
    if dep.boot_layout == "single":
        found.insert(1, Alert(
            "PdserveFallbackDown",
            f'up{{{d},role="fallback"}} == 0 unless on(deployment) (up{{{d},role="router"}} == 1)',
            "1m", "critical",
            f"{name}: the fallback server does not answer /metrics",
            f"Prometheus cannot scrape {{{{ $labels.instance }}}} (sglang-{name}) and the PD router does "
            f"not serve instead. Look at `systemctl status sglang-{name}`."))
    return found


def rule_groups(dep: Deployment) -> dict[str, Any]:
    # Evaluated as often as Prometheus scrapes: a rule cannot see anything newer.
    return {"groups": [{"name": f"pdserve-{dep.name}", "interval": f"{dep.monitoring.scrape_interval_secs}s",
                        "rules": [a.as_rule(dep) for a in alerts(dep)]}]}
