"""The router's settings (`[router]`): smg in PD mode, the deployment's only public endpoint.

Every default below is rendered explicitly (pdserve.render.argv.router_args), so a new smg release with
other defaults cannot change how a deployment behaves behind its back. Each says why it is what it is;
the rules that relate these settings to each other and to the rest of the file live in
pdserve.schema.rules_router. Ranges are smg 1.13.0's own (its parser and its start-up validation), or
narrower where a value smg takes would defeat the setting (tests/integration/test_router_settings.py
holds them against the real binary).

How a request meets a worker outage with the defaults (measured: docs/router-and-faults.md, "Router settings"):
- a worker that dies refuses connections: the first attempts of a request fail, the circuit breaker opens
  after cb_failure_threshold of them, and every request from then on gets 503 `no_available_workers` with
  `Retry-After: 1` within a second of arriving; the health check marks the worker unhealthy 3 s after its
  death and /readiness answers 503;
- a worker that stalls (a pause of a few seconds) accepts connections and fails no attempt: its requests
  wait and complete, the breaker stays closed;
- once the worker answers again the breaker tries it within cb_timeout_duration_secs (1 s), and the health
  check takes it back one interval (1 s) after its /health answers 200.
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

    # Worker health. smg's /readiness needs a Ready prefill AND a Ready decode in PD mode; a role with no
    # healthy worker gets 503 `no_available_workers` with `Retry-After: 1` at once.
    health_check_timeout_secs: Seconds = Field(
        30, description="--health-check-timeout-secs. SGLang releases that generate a token for /health (0.5.17, "
        "or SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION) can take 20 s to answer it under load; smg's 5 s would "
        "count a busy worker as failed. A worker that stalls (a pause, not a death) is waited for, not marked")
    health_check_interval_secs: int = Field(
        1, ge=1, le=3600, description="--health-check-interval-secs (smg default 60, at least 1): SGLang 0.5.23 "
        "answers /health without work, so probing each worker once a second is free; it sets how soon a "
        "restarted worker is taken back")
    health_failure_threshold: int = Field(
        3, ge=1, le=100, description="--health-failure-threshold (smg default 3): failed probes in a row before a "
        "worker is marked unhealthy and /readiness says 503 (3 s at 1 s). The breaker answers sooner")
    health_success_threshold: int = Field(
        1, ge=1, le=100, description="--health-success-threshold (smg default 2): a worker's /health 200 already "
        "means it finished loading, so one success takes it back (within one interval)")

    # The circuit breaker: what answers a request that meets a dead worker within a second. In PD HTTP mode smg
    # charges every failed attempt (retries included) to both legs, so the retries of one request open it: the
    # attempts that follow find no worker and get 503 with Retry-After at once. A worker that stalls fails no
    # attempt (its requests wait), so a pause does not open it. smg's own 60 s timeout kept a worker out a
    # minute after it was back (one H200, 2026-12-04: both sglang-router 0.3.2 and smg took a killed prefill back
    # 70 s after the kill); 1 s tries it again every second.
    circuit_breaker: bool = Field(
        True, description="smg's circuit breaker (--disable-circuit-breaker when false). On: it turns a dead "
        "worker's connection refusals into 503s with Retry-After within a second of a request's arrival (the "
        "health check takes 3 s). Off: a request that meets a dead worker is retried until the health check marks "
        "the worker (503, Retry-After) or its attempts end (502 without Retry-After), whichever comes first")
    cb_failure_threshold: int = Field(
        3, ge=1, le=U32, description="--cb-failure-threshold (smg default 10): failed attempts in a row that open "
        "it; every retry counts, so one request's first 3 attempts (about 0.15 s) do. Keep it below "
        "retry_max_retries, so that the request's next attempt meets the open breaker (503, Retry-After)")
    cb_success_threshold: int = Field(
        1, ge=1, le=U32, description="--cb-success-threshold (smg default 3): one success in half-open state "
        "closes it; a worker answering again is taken back at its first answered request")
    cb_timeout_duration_secs: Seconds = Field(
        1, description="--cb-timeout-duration-secs (smg default 60): an open breaker lets a request try the worker "
        "again after this long, so a worker back from a restart is used within a second, not a minute later")

    # Retries. In PD mode each retry picks a new prefill/decode pair; pdserve has one of each, so a retry can
    # only try the same pair again. They cover a stale pooled connection or a refused attempt until the breaker
    # opens; short pauses so the attempt that meets the open breaker comes soon.
    retry_max_retries: int = Field(
        6, ge=1, le=U32, description="--retry-max-retries: attempts per request, the first included (smg default "
        "5; 1 means no retry). 6: three to open the breaker, the next meets it; about 0.8 s of pauses in all")
    retry_initial_backoff_ms: int = Field(
        50, ge=1, le=U32, description="--retry-initial-backoff-ms (smg default 50, more than 0): the first pause; a "
        "stale connection or a worker's momentary refusal is retried almost at once")
    retry_max_backoff_ms: int = Field(
        250, ge=1, le=U32, description="--retry-max-backoff-ms (smg default 30000): the longest pause, which bounds "
        "how late a retrying request notices the open breaker")
    retry_backoff_multiplier: float = Field(
        1.5, ge=1.0, le=10.0, allow_inf_nan=False, description="--retry-backoff-multiplier (smg default 1.5, "
        "finite and at least 1)")
    retry_jitter_factor: float = Field(
        0.2, ge=0.0, le=1.0, allow_inf_nan=False, description="--retry-jitter-factor (smg default 0.2, 0-1): each "
        "pause varies by up to this share, so requests held together do not retry in lockstep")

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
