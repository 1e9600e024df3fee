"""sglang-router's /readiness answer as pdserve reads it, for the readiness gate and the verifier alike.

In PD mode the router is ready when it counts every worker healthy; a pdserve deployment gives it one
prefill and one decode server.
"""

from __future__ import annotations

from pdserve.probes.answers import Mismatch, Readiness, fit

PD_WORKER_COUNT = 2  # one prefill, one decode per deployment


def worker_counts(body: object, what: str = "/readiness") -> Readiness | Mismatch:
    """healthy_workers and total_workers from a /readiness body; None for what it does not say (sglang-router
    0.3.2 answers 503 with only {"status", "reason"} while it has no workers, and an error page is text)."""
    return fit(Readiness, {} if body is None or isinstance(body, str) else body, what)
