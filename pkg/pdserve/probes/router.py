"""The router's (smg's) /readiness answer as pdserve reads it, for the readiness gate and the verifier alike.

In PD mode smg answers 200 with {"status": "ready", "healthy_workers", "total_workers"} once it has a Ready
prefill AND a Ready decode; otherwise 503 with only {"status": "not ready", "reason"}: "insufficient healthy
workers", or "draining" once it got SIGTERM. pdserve wants more than a pair: every server of the deployment
healthy (one prefill and one decode on one host).
"""

from __future__ import annotations

from pdserve.probes.answers import Mismatch, Readiness, fit

PD_WORKER_COUNT = 2  # one prefill, one decode per deployment


def worker_counts(body: object, what: str = "/readiness") -> Readiness | Mismatch:
    """healthy_workers and total_workers from a /readiness body; None for what it does not say (smg answers 503
    with only {"status", "reason"} while it lacks a Ready pair or drains, and an error page is text)."""
    return fit(Readiness, {} if body is None or isinstance(body, str) else body, what)
