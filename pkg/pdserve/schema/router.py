"""The router's settings (`[router]`): smg in PD mode, the deployment's only public endpoint.

Every default below is rendered explicitly (pdserve.render.argv.router_args), so a new smg release with
other defaults cannot change how a deployment behaves behind its back. Each says why it is what it is;
the rules that relate these settings to each other and to the rest of the file live in
pdserve.schema.rules_router. Ranges are smg 1.13.0's own (its parser and its start-up validation), or
narrower where a value smg takes would defeat the setting (tests/integration/test_router_settings.py
holds them against the real binary).

How a request meets a worker outage with the defaults (measured: README, "Router settings"):
- a worker that dies is marked unhealthy after health_failure_threshold x health_check_interval_secs
  (3 s). Until then a request is retried (each retry picks a new prefill/decode pair in PD mode) for at
  most the retry budget, so a hiccup shorter than that costs no request; from then on smg answers 503
  `no_available_workers` with `Retry-After: 1` at once, and stops retrying requests already waiting;
- the worker is taken back one health_success_threshold x interval (1 s) after its /health answers 200.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdserve.schema.fields import MAX_LIST_ITEMS, Environment, FilePath, Host, Port, RouterExtraArgs, Seconds
from pdserve.schema.hosts import HostName

# Load-balancing policies of smg 1.13.0 (`--policy`, `--prefill-policy`, `--decode-policy`; a test compares them
# with the pinned router's own parser).
Policy = Literal["random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
                 "consistent_hashing", "prefix_hash"]

# smg keeps counts and milliseconds in 32-bit unsigned integers; a value past that overflows at start.
U32 = 2**32 - 1


class RouterSpec(BaseModel):
    """The router (smg) in PD mode: the only public endpoint."""

    # strict: no coercion (`port = true` is not port 1, `"8000"` is not 8000, 1800.0 is not 1800).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    host: Host = "127.0.0.1"
    port: Port = 30001
    hosts: list[HostName] = Field(default_factory=list, max_length=MAX_LIST_ITEMS, description="Multi-host "
                                  "deployments: the host(s) that run a router, each a full view of every server")
    prometheus_host: Host = "127.0.0.1"
    prometheus_port: Port = 29000
    health_check_port: Port | None = Field(
        None, description="--health-check-port: smg answers /liveness, /readiness and /health on this port as well, "
        "from a runtime of their own, so a probe still gets an answer while the gateway is saturated. Unset: off "
        "(the probes stay on router.port), because any fixed default would collide between two deployments on "
        "one host; the reference deployment sets 29001")
    policy: Policy | None = Field(None, description="--policy for both roles; unset keeps the router's default")
    prefill_policy: Policy | None = None
    decode_policy: Policy | None = None
    worker_startup_timeout_secs: Seconds = 1800
    request_timeout_secs: Seconds = Field(
        1800, description="--request-timeout-secs: the longest a request may take end to end (a long generation "
        "streams for many minutes). Retry budget and admission wait must fit inside it")
    upstream_pool_idle_timeout_secs: Seconds = Field(
        3, description="--upstream-pool-idle-timeout-secs: how long smg keeps an idle pooled connection to a "
        "worker. It must stay below the workers' keep-alive (SGLANG_TIMEOUT_KEEP_ALIVE, SGLang's default 5 s): a "
        "connection the worker already closed, reused, is a 500 to the client. 3 s is smg's default and under "
        "SGLang's; 0 (keep forever) is refused for that reason")

    # Worker health. smg's /readiness needs a Ready prefill AND a Ready decode in PD mode, and smg stops
    # retrying and answers 503 at once for a role with no healthy worker: these decide how soon that is.
    health_check_timeout_secs: Seconds = Field(
        30, description="--health-check-timeout-secs. SGLang releases that generate a token for /health (0.5.17, "
        "or SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION) can take 20 s to answer it under load; smg's 5 s would "
        "count a busy worker as failed")
    health_check_interval_secs: int = Field(
        1, ge=1, le=3600, description="--health-check-interval-secs (smg default 60, at least 1): SGLang 0.5.23 "
        "answers /health without work, so probing each worker once a second is free, and it sets how soon a dead "
        "worker is noticed and a restarted one taken back")
    health_failure_threshold: int = Field(
        3, ge=1, le=100, description="--health-failure-threshold (smg default 3): failed probes in a row before a "
        "worker is marked unhealthy. 3 at 1 s: a worker that died is out of the router 2-3 s later (requests then "
        "get a 503 with Retry-After at once), and a pause of 2 s or less never marks it")
    health_success_threshold: int = Field(
        1, ge=1, le=100, description="--health-success-threshold (smg default 2): a worker's /health 200 already "
        "means it finished loading, so one success takes it back (within one interval)")

    # Retries. In PD mode each retry picks a new prefill/decode pair; pdserve has one of each, so a retry can
    # only wait for the same pair. The budget (the sum of the backoffs) rides out a hiccup until the health
    # check has decided; past that smg stops retrying anyway.
    retry_max_retries: int = Field(
        10, ge=1, le=U32, description="--retry-max-retries: attempts per request, the first included (smg default "
        "5; 1 means no retry). 10 attempts with the backoffs below wait about 3.5 s in all, just past the 3 s a "
        "dead worker takes to be marked unhealthy")
    retry_initial_backoff_ms: int = Field(
        50, ge=1, le=U32, description="--retry-initial-backoff-ms (smg default 50, more than 0): the first pause; a "
        "stale connection or a worker's momentary refusal is retried almost at once")
    retry_max_backoff_ms: int = Field(
        1000, ge=1, le=U32, description="--retry-max-backoff-ms (smg default 30000): the longest pause, so a held "
        "request notices within a second that the worker answers again")
    retry_backoff_multiplier: float = Field(
        1.5, ge=1.0, le=10.0, allow_inf_nan=False, description="--retry-backoff-multiplier (smg default 1.5, "
        "finite and at least 1)")
    retry_jitter_factor: float = Field(
        0.2, ge=0.0, le=1.0, allow_inf_nan=False, description="--retry-jitter-factor (smg default 0.2, 0-1): each "
        "pause varies by up to this share, so requests held together do not retry in lockstep")

    # The circuit breaker. In PD HTTP mode smg charges every failed attempt (retries included) to both legs,
    # so two failed requests can open it, and an open breaker keeps a worker out for cb_timeout_duration_secs
    # after it is back. With one worker per role the health check already takes a dead worker out, independent
    # of load; a breaker, which counts attempts, would open on a 2 s hiccup under load.
    circuit_breaker: bool = Field(
        False, description="smg's circuit breaker (--disable-circuit-breaker when false). Off: with one worker per "
        "role there is no other to fail over to, the health check takes a dead worker out within 3 s whatever the "
        "load, and a breaker that counts every retry opens on a short hiccup under load, then keeps the worker "
        "out for cb_timeout_duration_secs after it is back")
    cb_failure_threshold: int = Field(
        10, ge=1, le=U32, description="--cb-failure-threshold (circuit_breaker = true only): failed attempts that "
        "open it; every retry counts")
    cb_success_threshold: int = Field(
        3, ge=1, le=U32, description="--cb-success-threshold (circuit_breaker = true only): successes in half-open "
        "state that close it")
    cb_timeout_duration_secs: Seconds = Field(
        60, description="--cb-timeout-duration-secs (circuit_breaker = true only): how long an open breaker "
        "refuses before it tries the worker again")

    # Admission in front of prefill. smg holds a request that finds every prefill slot taken in a queue, and
    # answers 429 (`pd_prefill_queue_full` at once, `pd_prefill_queue_timeout` after the wait).
    prefill_max_inflight_requests_per_worker: int | None = Field(
        None, ge=1, le=2**31 - 1, description="--prefill-max-inflight-requests-per-worker: requests a prefill server "
        "works on at once; more wait in the router's queue. Unset: no limit (smg's default): how many a prefill "
        "takes depends on the model, its GPUs and the prompts, so only a measurement of the deployment can say")
    prefill_queue_size: int | None = Field(
        None, ge=0, le=U32, description="--prefill-queue-size: requests that may wait for a prefill slot; past it, "
        "429 at once (0: none wait). Needs prefill_max_inflight_requests_per_worker. Unset: smg's 100")
    prefill_queue_timeout_secs: Seconds | None = Field(
        None, description="--prefill-queue-timeout-secs: the longest a request waits for a prefill slot, then 429. "
        "Needs prefill_max_inflight_requests_per_worker; at most request_timeout_secs. Unset: smg's 60")

    shutdown_grace_period_secs: int | None = Field(
        None, ge=1, le=365 * 24 * 3600, description="--shutdown-grace-period-secs: how long the router drains "
        "requests in flight after SIGTERM (its /readiness answers 503 \"draining\" at once). Must stay below "
        "systemd.stop_timeout_sec: smg's own 180 s outlasts the stop timeout, so systemd would SIGKILL it "
        "mid-drain and a worker restart ordered behind that stop would wait. Unset: 30 s, or "
        "systemd.stop_timeout_sec - 5 s when that is shorter")
    api_key_file: FilePath | None = Field(
        None, description="File holding the API key clients must send; passed with LoadCredential="
    )
    extra_args: RouterExtraArgs = Field(default_factory=list, description="Further router flags, verbatim")
    env: Environment = Field(default_factory=dict)
