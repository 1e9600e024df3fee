"""The metric names the monitoring files use, each from the pinned software itself, never guessed.

SGLang 0.5.23 (sglang/srt/observability/metrics_collector.py): the scheduler's families carry the labels
model_name, engine_type (prefill / decode / unified, from DisaggregationMode.to_engine_type), tp_rank,
pp_rank, moe_ep_rank; the tokenizer's carry model_name and engine_type, several also is_streaming.
SGLang's /metrics registry holds only prometheus_client's MultiProcessCollector
(sglang/srt/utils/common.py add_prometheus_middleware), so it exports no process_* metrics.

The router, smg 1.13.0 (the Rust binary): smg_* families, no process_* metrics either. Each name and label
below was read from its Prometheus listener in front of the stand-in workers, with traffic served, a failed
KV hand-off, a refused bootstrap port and a prefill down (tests/fixtures/smg_exposition.py records it in
tests/fixtures/recorded/, and tests/integration/test_router_metrics_smg.py checks the binary still says so).
smg registers some labelled families at start with every label value at 0 (the breaker's transitions, the
retry counters); others appear with their first event (the PD histograms, the rendezvous failures, each
error_code of smg_http_responses_total).

A labelled prometheus_client counter has no series before its first increment: the failure counters
appear with the first failure, and the tokenizer's histograms with the first finished request.
"""

from __future__ import annotations

# SGLang scheduler (SchedulerMetricsCollector)
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"  # used / capacity of the KV pool, 0-1
GEN_THROUGHPUT = "sglang:gen_throughput"  # tokens/s, as the scheduler logs it
# The PD hand-off queues (log_stats): prefill waiting for its decode's bootstrap / KV being sent; decode
# waiting for KV memory / for the KV to arrive.
PD_QUEUES = ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
             "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs")
KV_TRANSFER_LATENCY_MS = "sglang:kv_transfer_latency_ms"  # histogram, observed by the prefill (sender)
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"  # counter, prefill.py and decode.py
# Set once at start (emit_constants): what SGLang took of the GPU, not live GPU memory.
GPU_MEMORY_PARTS_GB = ("sglang:weight_memory_usage_gb", "sglang:kv_cache_memory_usage_gb",
                       "sglang:graph_memory_usage_gb")

# SGLang tokenizer (TokenizerMetricsCollector)
TTFT = "sglang:time_to_first_token_seconds"  # histogram, labels + is_streaming
ITL = "sglang:inter_token_latency_seconds"  # histogram
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
# Gauge set once per start (emit_startup_time) from measured durations: its value changes at a restart.
STARTUP_TIME = "sglang:startup_time_seconds"
STARTUP_PHASE = "tokenizer_e2e"

# The router (smg 1.13.0)
ROUTER_HEALTH_CHECKS = "smg_worker_health_checks_total"  # labels worker_type, result; every interval
ROUTER_WORKER_HEALTH = "smg_worker_health"  # gauge per worker URL: 1 healthy, 0 not (label worker)
ROUTER_REQUESTS = "smg_router_requests_total"  # labels endpoint, streaming, model, backend_type, ...
ROUTER_REQUEST_DURATION = "smg_router_request_duration_seconds"  # histogram, requests that were served
ROUTER_HTTP_RESPONSES = "smg_http_responses_total"  # labels path, status_code, error_code ("" on success)
ROUTER_HTTP_REQUESTS = "smg_http_requests_total"  # labels method, path; /readiness is polled at each start
ROUTER_WORKER_ERRORS = "smg_worker_errors_total"  # labels worker_type, connection_mode, error_type
ROUTER_WORKER_RETRIES = "smg_worker_retries_total"  # labels worker_type, endpoint
# What smg answers, at once and with Retry-After, when no prefill/decode pair can take a request (a role
# down, or both breakers open): a 503 with this error_code. smg_worker_retries_exhausted_total stays 0
# then (it gives up before any retry), so a refusal is read here, never from the retry counters.
NO_WORKERS = "no_available_workers"
# PD: what only the router sees, both legs of one request. Histograms by backend_type, model, runtime.
PD_TTFT = "smg_pd_ttft_seconds"  # prefill dispatch to the decode's response head: the client's wait
PD_PREFILL_DURATION = "smg_pd_prefill_duration_seconds"  # prefill dispatch to the end of its response
# Labels leg (prefill/decode) and phase. Over HTTP only phase="probe" occurs: at registration the router
# connects to the prefill's bootstrap port, and a refusal leaves the leg registered but unable to hand off
# KV. (smg_pd_bootstrap_failures_total, "bootstrap injection failures", is not read: in smg's source it
# counts only a dispatched body that is not a JSON object, and no traffic or fault here ever produced it.)
PD_RENDEZVOUS_FAILURES = "smg_pd_rendezvous_failures_total"
BOOTSTRAP_PROBE = "probe"
# The circuit breaker per worker URL: transitions by from/to (closed, open, half_open), all at 0 from start.
BREAKER_TRANSITIONS = "smg_worker_cb_transitions_total"
BREAKER_OPEN = "open"

# What no pinned metric tells, and who would.
GPU_MEMORY_EXPORTER = ("live per-GPU memory comes from NVIDIA's dcgm-exporter (DCGM_FI_DEV_FB_USED, "
                       "DCGM_FI_DEV_FB_FREE), which pdserve does not render")
