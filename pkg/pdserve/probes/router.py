"""sglang-router's /readiness answer as pdserve reads it, for the readiness gate and the verifier alike.

In PD mode the router is ready when it counts every worker healthy; a pdserve deployment gives it one
prefill and one decode server.
"""

from __future__ import annotations

PD_WORKER_COUNT = 2  # one prefill, one decode per deployment


def worker_counts(body: object) -> tuple[object, object]:
    """(healthy_workers, total_workers) from a /readiness body; None for what it does not say (sglang-router
    0.3.2 answers 503 with only {"status", "reason"} while it has no workers)."""
    counts = body if isinstance(body, dict) else {}
    return counts.get("healthy_workers"), counts.get("total_workers")
