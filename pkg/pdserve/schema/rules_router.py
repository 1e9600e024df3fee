"""Rules that relate the router's settings to each other and to the rest of the deployment. Each returns
every problem it finds; the settings and why each default is what it is: pdserve.schema.router.

smg checks some of these at start (a backoff range upside down, admission options without a limit) and
exits: pdserve says so before a unit is written. Others smg takes without a word, and the deployment
misbehaves under load or at a restart (a stale pooled connection as a 500, a drain cut by SIGKILL).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from pdserve.schema.config import Deployment
from pdserve.schema.derived import router_shutdown_grace
from pdserve.schema.problems import Problem, Severity
from pdserve.schema.router import RouterSpec
from pdserve.schema.topology import servers

KEEP_ALIVE_ENV = "SGLANG_TIMEOUT_KEEP_ALIVE"
# SGLang's keep-alive where the variable is unset or not an integer (sglang 0.5.23 srt/environ.py: EnvInt(5),
# which falls back to its default, with a warning, on a value int() refuses).
SGLANG_KEEP_ALIVE_SEC = 5
# What smg 1.13.0 uses for an admission option left unset once admission is on (its --help).
SMG_PREFILL_QUEUE_TIMEOUT_SEC = 60
# A request held longer than this while a worker restarts is "held", not "ridden over a hiccup": with no
# admission limit, every request that arrives meanwhile is held too.
HOLD_WARN_SEC = 10


def retry_budget_ms(router: RouterSpec) -> float:
    """The longest smg may pause between the attempts of one request: the sum of its backoffs, pause n being
    min(initial x multiplier^n, max) stretched by the full jitter (smg's BackoffCalculator), over the
    retry_max_retries - 1 pauses between retry_max_retries attempts. Closed form: the values reach 2^32."""
    pauses = router.retry_max_retries - 1
    initial, ceiling = router.retry_initial_backoff_ms, router.retry_max_backoff_ms
    factor = router.retry_backoff_multiplier
    if factor == 1.0 or initial >= ceiling:
        total: float = pauses * min(initial, ceiling)
    else:
        growing = min(pauses, math.ceil(math.log(ceiling / initial) / math.log(factor)))
        total = initial * (factor ** growing - 1) / (factor - 1) + (pauses - growing) * ceiling
    return total * (1 + router.retry_jitter_factor)


def health_detection_sec(router: RouterSpec) -> int:
    """How long a dead worker stays in the router: failed probes in a row, one interval apart."""
    return router.health_failure_threshold * router.health_check_interval_secs


def _keep_alive(dep: Deployment) -> Iterator[tuple[str, str, int, str | None]]:
    """(where it is set, the value as written, seconds SGLang keeps an idle connection, what is wrong with the
    value) for each distinct setting the PD servers run with; field and text "" where unset."""
    seen: set[str] = set()
    for server in servers(dep):
        if KEEP_ALIVE_ENV in server.spec.env:
            field, text = f"{server.field}.env.{KEEP_ALIVE_ENV}", server.spec.env[KEEP_ALIVE_ENV]
        elif KEEP_ALIVE_ENV in dep.environment:
            field, text = f"environment.{KEEP_ALIVE_ENV}", dep.environment[KEEP_ALIVE_ENV]
        else:
            field, text = "", ""
        if field in seen:
            continue
        seen.add(field)
        if not field:
            yield field, text, SGLANG_KEEP_ALIVE_SEC, None
            continue
        try:
            seconds = int(text)  # as SGLang reads it (EnvInt)
        except ValueError:
            yield field, text, SGLANG_KEEP_ALIVE_SEC, (f"is not a whole number of seconds: SGLang ignores it "
                                                       f"(with a warning) and keeps {SGLANG_KEEP_ALIVE_SEC} s")
            continue
        yield field, text, seconds, None if seconds > 0 else "is not a positive number of seconds: SGLang refuses it"


def pool_idle_below_keep_alive(dep: Deployment) -> Iterator[Problem]:
    idle = dep.router.upstream_pool_idle_timeout_secs
    for field, text, seconds, wrong in _keep_alive(dep):
        if wrong is not None:
            yield Problem(field, text, wrong, f"write whole seconds above router.upstream_pool_idle_timeout_secs "
                          f"({idle}), e.g. {KEEP_ALIVE_ENV} = \"75\"")
            if seconds <= 0:
                continue
        if idle >= seconds:
            where = f"{field} = {text!r}" if field and wrong is None else f"SGLang's {seconds} s"
            setting = field or f"environment.{KEEP_ALIVE_ENV}"
            yield Problem("router.upstream_pool_idle_timeout_secs", idle,
                          f"is not below the workers' keep-alive ({where}): a worker closes an idle connection the "
                          "router may still reuse, and the request sent on it fails with a 500",
                          f"lower it to at most {seconds - 1}, or raise {setting} above {idle}" if seconds > 1 else
                          f"raise {setting} above {idle}")


def retries_fit_request_timeout(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    budget = retry_budget_ms(router) / 1000
    if budget >= router.request_timeout_secs:
        yield Problem("router.retry_max_retries", router.retry_max_retries,
                      f"with backoffs of {router.retry_initial_backoff_ms}-{router.retry_max_backoff_ms} ms "
                      f"(x{router.retry_backoff_multiplier:g}, jitter {router.retry_jitter_factor:g}) pauses up to "
                      f"{budget:.1f} s between attempts, not less than router.request_timeout_secs "
                      f"({router.request_timeout_secs}): a request would time out while it waits to be retried",
                      "lower router.retry_max_retries or router.retry_max_backoff_ms (the defaults pause about "
                      "0.8 s), or raise router.request_timeout_secs")


def backoff_range(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    if router.retry_initial_backoff_ms > router.retry_max_backoff_ms:
        # smg refuses to start: "retry.max_backoff_ms ... Must be >= initial_backoff_ms".
        yield Problem("router.retry_max_backoff_ms", router.retry_max_backoff_ms,
                      f"is below router.retry_initial_backoff_ms ({router.retry_initial_backoff_ms}); smg refuses "
                      "to start", f"raise it to at least {router.retry_initial_backoff_ms}, or lower "
                      "router.retry_initial_backoff_ms")


def admission_needs_a_limit(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    if router.prefill_max_inflight_requests_per_worker is not None:
        return
    for field in ("prefill_queue_size", "prefill_queue_timeout_secs"):
        value = getattr(router, field)
        if value is not None:
            # smg refuses to start: "Prefill queue options require --prefill-max-inflight-requests-per-worker".
            yield Problem(f"router.{field}", value, "sets a queue for prefill admission, which has no limit to "
                          "queue behind: smg refuses to start", "set router.prefill_max_inflight_requests_per_worker "
                          f"(requests one prefill server works on at once), or remove router.{field}")


def admission_wait_fits_request_timeout(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    if router.prefill_max_inflight_requests_per_worker is None:
        return
    wait = router.prefill_queue_timeout_secs
    if wait is None and SMG_PREFILL_QUEUE_TIMEOUT_SEC >= router.request_timeout_secs:
        yield Problem("router.prefill_queue_timeout_secs", None, f"is unset, so smg waits its own "
                      f"{SMG_PREFILL_QUEUE_TIMEOUT_SEC} s for a prefill slot, not less than "
                      f"router.request_timeout_secs ({router.request_timeout_secs}): a queued request would time out "
                      "instead of getting a 429",
                      f"set it below {router.request_timeout_secs}")
    elif wait is not None and wait >= router.request_timeout_secs:
        yield Problem("router.prefill_queue_timeout_secs", wait, f"is not below router.request_timeout_secs "
                      f"({router.request_timeout_secs}): a queued request would time out instead of getting a 429 "
                      "it can retry", f"lower it to at most {router.request_timeout_secs - 1}, or raise "
                      "router.request_timeout_secs")


def held_requests_are_bounded(dep: Deployment) -> Iterator[Problem]:
    """Holding requests through a restart is a choice: the breaker off, the worker kept in the router (a high
    health_failure_threshold) and retries that outlast the restart. Without an admission limit nothing
    bounds how many are held. (With the breaker on, a request is answered once its attempts open it.)"""
    router = dep.router
    held = min(retry_budget_ms(router) / 1000, health_detection_sec(router))
    if not router.circuit_breaker and held > HOLD_WARN_SEC and router.prefill_max_inflight_requests_per_worker is None:
        yield Problem("router.prefill_max_inflight_requests_per_worker", None,
                      f"is unset while a request that arrives during a worker restart is held up to {held:.0f} s "
                      f"(the retries pause {retry_budget_ms(router) / 1000:.0f} s, and a dead worker stays in the "
                      f"router {health_detection_sec(router)} s): nothing bounds how many are held",
                      "set router.prefill_max_inflight_requests_per_worker and router.prefill_queue_size, or keep the "
                      "defaults (a 503 with Retry-After within a second)", Severity.WARNING)


_BREAKER_FIELDS = ("cb_failure_threshold", "cb_success_threshold", "cb_timeout_duration_secs")
# An open breaker keeps a worker out this long after it is back before pdserve calls it a problem.
BREAKER_TIMEOUT_WARN_SEC = 10


def breaker_settings(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    if not router.circuit_breaker:
        for field in _BREAKER_FIELDS:
            if field in router.model_fields_set:
                yield Problem(f"router.{field}", getattr(router, field), "has no effect: router.circuit_breaker "
                              "is false", f"set router.circuit_breaker = true, or remove router.{field}",
                              Severity.WARNING)
        return
    if router.cb_timeout_duration_secs > BREAKER_TIMEOUT_WARN_SEC:
        yield Problem("router.cb_timeout_duration_secs", router.cb_timeout_duration_secs,
                      "keeps a worker out that long after it is back: in PD mode smg opens the breaker on the failed "
                      "attempts of a restart, and tries the worker again only after this timeout",
                      f"lower it to at most {BREAKER_TIMEOUT_WARN_SEC} (the default is 1)", Severity.WARNING)


def outage_answer_is_retryable(dep: Deployment) -> Iterator[Problem]:
    """A request that meets a dead worker ends in smg's 503 with Retry-After only if its attempts last until
    the worker is out (the breaker open, or the health check's verdict); else it fails with the last attempt's
    502 `PD disaggregation request failed`, without Retry-After (measured with smg 1.13.0)."""
    router = dep.router
    fix = ("raise router.retry_max_retries (the defaults: 6 attempts against a breaker that opens at 3)")
    if router.circuit_breaker and router.retry_max_retries <= router.cb_failure_threshold:
        yield Problem("router.retry_max_retries", router.retry_max_retries,
                      f"is not above router.cb_failure_threshold ({router.cb_failure_threshold}): a request that "
                      "meets a dead worker uses up its attempts before they open the breaker, and fails with a 502 "
                      "without Retry-After instead of a 503 the client can retry",
                      f"{fix}, or lower router.cb_failure_threshold", Severity.WARNING)
    elif not router.circuit_breaker and retry_budget_ms(router) / 1000 < health_detection_sec(router):
        yield Problem("router.retry_max_retries", router.retry_max_retries,
                      f"pauses {retry_budget_ms(router) / 1000:.1f} s in all, less than the "
                      f"{health_detection_sec(router)} s the health check takes to mark a dead worker, with the "
                      "breaker off: a request that meets a dead worker fails with a 502 without Retry-After instead "
                      "of a 503 the client can retry",
                      "turn router.circuit_breaker on (the default), or raise router.retry_max_retries or "
                      "router.retry_max_backoff_ms", Severity.WARNING)


def router_drains_before_sigkill(dep: Deployment) -> Iterator[Problem]:
    # The drain as rendered (explicit or derived), so a tiny stop timeout is caught even when it is unset.
    grace, stop = router_shutdown_grace(dep), dep.systemd.stop_timeout_sec
    if grace < stop:
        return
    why = ("systemd SIGKILLs the router mid-drain, and a worker restart ordered behind that stop waits for it")
    if dep.router.shutdown_grace_period_secs is None:
        yield Problem("systemd.stop_timeout_sec", stop,
                      f"leaves no time for the router's drain (at least 1 s, which must end before it): {why}",
                      "raise systemd.stop_timeout_sec to at least 2 (the default is 120)")
        return
    yield Problem(
        "router.shutdown_grace_period_secs",
        grace,
        f"is not below systemd.stop_timeout_sec ({stop}): {why}",
        f"lower it to at most {stop - 5 if stop > 5 else max(1, stop - 1)}, raise systemd.stop_timeout_sec, "
        "or leave it unset",
    )


RULES = (
    pool_idle_below_keep_alive,
    backoff_range,
    retries_fit_request_timeout,
    admission_needs_a_limit,
    admission_wait_fits_request_timeout,
    held_requests_are_bounded,
    breaker_settings,
    outage_answer_is_retryable,
    router_drains_before_sigkill,
)
