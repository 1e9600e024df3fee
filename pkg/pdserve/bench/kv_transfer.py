"""The KV hand-off's time from the servers' own metrics: SGLang's prefill observes every transfer it sends
in the histogram sglang:kv_transfer_latency_ms; its _sum and _count read before and after a sweep point
give the mean transfer time of that point's requests. Only a PD layout has it; a single server has no
hand-off, and a server that does not expose it gives None (never a made-up 0)."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.probes import http, metrics
from pdserve.probes.metrics import MetricsObs
from pdserve.render.monitoring.metrics import KV_TRANSFER_LATENCY_MS

SCRAPE_TIMEOUT = 10.0


def _totals(observations: Sequence[MetricsObs]) -> tuple[float, float] | None:
    sums, counts = [], []
    for obs in observations:
        if obs.status != 200:
            return None
        total_sum = metrics.total(obs, f"{KV_TRANSFER_LATENCY_MS}_sum")
        total_count = metrics.total(obs, f"{KV_TRANSFER_LATENCY_MS}_count")
        sums.append(total_sum or 0.0)
        counts.append(total_count or 0.0)
    return sum(sums), sum(counts)


def mean_ms(before: Sequence[MetricsObs], after: Sequence[MetricsObs]) -> float | None:
    """The mean transfer time (ms) of the transfers between the two scrapes; None when a scrape failed,
    none happened, or the counters went back (a server restarted between them)."""
    start, end = _totals(before), _totals(after)
    if start is None or end is None:
        return None
    transfers, milliseconds = end[1] - start[1], end[0] - start[0]
    if transfers <= 0 or milliseconds < 0:
        return None
    return milliseconds / transfers


def scrape(urls: Sequence[str]) -> list[MetricsObs]:
    """Each server's /metrics, bounded in time and size (SGLang serves it without the API key)."""
    with http.client(SCRAPE_TIMEOUT, metrics.MAX_BYTES) as client:
        return [metrics.read(client, f"{url}/metrics", SCRAPE_TIMEOUT) for url in urls]
