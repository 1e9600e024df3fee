"""Metrics: each role's endpoint answers with the families the monitoring files read, no KV transfer
failed during the end-to-end checks, and the router counted the requests they sent.

The names are the monitoring's own (pdserve.render.monitoring.metrics), so what the verifier requires
is what the rules and the dashboard read. Only families that have a series on an idle server are
required: SGLang's scheduler gauges (logged on idle at least every 30 s), the constants it sets at
start, and the router's worker health, health checks and breaker transitions (smg registers these at 0 for
each worker). Not its HTTP counters: a router whose readiness is asked on --health-check-port alone has no
series of them until a request reaches its main port. The failure counters and the latency histograms have
no series before their first event.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdserve.probes.metrics import MetricsObs, total
from pdserve.render.monitoring import metrics as m
from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed, skipped, warned

WORKER_FAMILIES = (m.RUNNING, m.QUEUED, m.TOKEN_USAGE, m.GEN_THROUGHPUT, *m.GPU_MEMORY_PARTS_GB, m.STARTUP_TIME)
ROUTER_FAMILIES = (m.ROUTER_WORKER_HEALTH, m.ROUTER_HEALTH_CHECKS, m.BREAKER_TRANSITIONS)
CHAT_PATH = "/v1/chat/completions"


def required_families(role: str) -> tuple[str, ...]:
    return ROUTER_FAMILIES if role == "router" else WORKER_FAMILIES


def _unit(exp: Expectations, role: str) -> str:
    return exp.router_unit if role == "router" else exp.workers[role].unit


def _no_answer_fix(exp: Expectations, role: str, obs: MetricsObs) -> str:
    unit = _unit(exp, role)
    if role == "router":
        return (f"the router's Prometheus listener (router.prometheus_host / prometheus_port, {obs.url}) did not "
                f"answer: check --prometheus-host/--prometheus-port in `systemctl cat {unit}` against the deployment "
                f"and whether another process holds the port (`ss -ltnp`); `journalctl -u {unit} -n 100`")
    if obs.status == 404:
        return (f"the server answers but serves no /metrics: pdserve renders --enable-metrics on both servers; look "
                f"for a drop-in that replaces the command line (`systemctl cat {unit}`) and re-render "
                f"(`pdserve render`)")
    return f"the server did not answer: `systemctl status {unit}`; `journalctl -u {unit} -n 100`"


def check_endpoint(exp: Expectations, role: str, obs: MetricsObs) -> CheckResult:
    cid = f"metrics.{role}"
    families = required_families(role)
    expected = f"{obs.url}: 200 with series of {', '.join(families)}"
    if not obs.ok:
        return failed(cid, obs.describe(), expected, _no_answer_fix(exp, role, obs))
    missing = [f for f in families if not obs.series(f)]
    details = [f"{f}: declared ({obs.declared[f]}) but no series" for f in missing if f in obs.declared]
    if obs.bad_lines:
        details.append(f"{obs.bad_lines} line(s) not in the text format, e.g. {obs.bad_examples[0]!r}")
    observed = f"HTTP 200, {len(obs.samples)} series" + (f"; missing: {', '.join(missing)}" if missing else "")
    if missing:
        software = "smg " + exp.router_version if role == "router" else "SGLang " + exp.sglang_version
        return failed(cid, observed, expected,
                      f"the alert rules and the dashboard read these families: the process on this port is not "
                      f"{software} (see versions.{role}), or it is still starting", details)
    return passed(cid, observed, expected, details)


def _before_after(before: MetricsObs | None, after: MetricsObs, name: str, **match: str) -> tuple[float, float]:
    """(before, after) of a counter; a family without series counts as 0 (no event yet)."""
    return (total(before, name, **match) or 0.0) if before else 0.0, total(after, name, **match) or 0.0


def _unread(cid: str, expected: str,
            readings: Mapping[str, tuple[MetricsObs | None, MetricsObs | None]]) -> CheckResult | None:
    """The failure when a reading before or after the end-to-end checks is missing; else None."""
    gaps = [f"{role} {when}: {obs.describe() if obs else 'not read'}"
            for role, (before, after) in readings.items()
            for when, obs in (("before", before), ("after", after)) if obs is None or not obs.ok]
    if not gaps:
        return None
    return failed(cid, "no reading to compare: " + "; ".join(gaps), expected,
                  "a metrics endpoint did not answer before or after the end-to-end checks: see metrics.prefill, "
                  "metrics.decode and metrics.router", gaps)


def check_transfer_failures(exp: Expectations, readings: dict[str, tuple[MetricsObs | None, MetricsObs]],
                            requests: int) -> CheckResult:
    """readings: role -> (before the first end-to-end request, after the last)."""
    cid = "metrics.kv_transfer"
    expected = f"{m.TRANSFER_FAILED} did not increase on prefill or decode during the end-to-end checks"
    if requests == 0:
        return skipped(cid, "no end-to-end request was sent (e2e.* not selected), so there is no interval to judge",
                       expected)
    unread = _unread(cid, expected, readings)
    if unread:
        return unread
    parts, increased, went_back = [], [], []
    for role, (before, after) in readings.items():
        was, now = _before_after(before, after, m.TRANSFER_FAILED)
        if not (before and before.series(m.TRANSFER_FAILED)) and not after.series(m.TRANSFER_FAILED):
            parts.append(f"{role}: no series before or after (no failure since start)")
            continue
        parts.append(f"{role}: {was:g} -> {now:g}")
        if now > was:
            increased.append(f"{role} +{now - was:g}")
        elif now < was:
            went_back.append(role)
    observed = f"over {requests} requests: " + "; ".join(parts)
    if increased:
        units = " -u ".join(exp.workers[r].unit for r in readings)
        return failed(cid, observed, expected,
                      f"KV transfers from prefill to decode failed ({', '.join(increased)}): `journalctl -u {units}` "
                      f"names the room and the reason; check transfer.backend and transfer.ib_devices, and that the "
                      f"decode reaches the prefill's bootstrap port {exp.bootstrap_port}")
    if went_back:
        return warned(cid, observed, expected,
                      f"the counter went down on {', '.join(went_back)}: the server restarted during the checks; "
                      f"run pdserve verify again once it is up (`journalctl -u "
                      f"{' -u '.join(exp.workers[r].unit for r in went_back)}` says why it restarted)")
    return passed(cid, observed, expected)


def check_router_requests(exp: Expectations, before: MetricsObs | None, after: MetricsObs | None,
                          requests: int) -> CheckResult:
    cid = "metrics.router_requests"
    expected = f"{m.ROUTER_REQUESTS} grew by at least the {requests} requests the end-to-end checks sent"
    if requests == 0:
        return skipped(cid, "no end-to-end request was sent (e2e.* not selected)",
                       f"{m.ROUTER_REQUESTS} grows by the requests the end-to-end checks send")
    unread = _unread(cid, expected, {"router": (before, after)})
    if unread:
        return unread
    assert after is not None  # _unread fails without a reading after
    was, now = _before_after(before, after, m.ROUTER_REQUESTS)
    http_was, http_now = _before_after(before, after, m.ROUTER_HTTP_REQUESTS, path=CHAT_PATH)
    observed = f"{m.ROUTER_REQUESTS} {was:g} -> {now:g} (+{now - was:g}) for {requests} requests sent"
    details = [f'{m.ROUTER_HTTP_REQUESTS}{{path="{CHAT_PATH}"}} {http_was:g} -> {http_now:g}']
    if now < was:
        return warned(cid, observed, expected,
                      f"the router's counters went back: it restarted during the checks (`journalctl -u "
                      f"{exp.router_unit}`); run pdserve verify again", details)
    if now - was < requests:
        return failed(cid, observed, expected,
                      f"the Prometheus listener at {after.url} does not count this router's traffic: another router "
                      f"(another deployment's, or one started by hand) holds router.prometheus_port, or the requests "
                      f"went elsewhere; compare `ss -ltnp` with `systemctl cat {exp.router_unit}`", details)
    return passed(cid, observed, expected, details)
