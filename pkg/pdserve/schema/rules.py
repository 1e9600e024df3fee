"""Rules that relate several fields of a deployment. Each returns every problem it finds."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from pdserve.schema.addresses import is_loopback
from pdserve.schema.config import WORKER_ROLES, Deployment, ServerSpec, WorkerSpec
from pdserve.schema.extra_args import ROUTER_EXACT_FLAGS, SERVER_EXACT_FLAGS, long_flag, read_as
from pdserve.schema.problems import Problem, Severity
from pdserve.schema.rules_gpus import disjoint_gpus
from pdserve.schema.rules_ports import distinct_ports
from pdserve.schema.topology import servers

Rule = Callable[[Deployment], Iterator[Problem]]

# Flags pdserve renders from the schema; repeating one in extra_args would make two sources of truth.
RENDERED_SERVER_FLAGS = {
    "--model-path": "model.path",
    "--model": "model.path",
    "--trust-remote-code": "model.trust_remote_code",
    "--enable-metrics": "nothing: pdserve always sets it (/metrics for Prometheus)",
    "--served-model-name": "model.served_name",
    "--reasoning-parser": "model.reasoning_parser",
    "--tool-call-parser": "model.tool_call_parser",
    "--chat-template": "model.chat_template",
    "--context-length": "model.context_length",
    "--kv-cache-dtype": "model.kv_cache_dtype",
    "--host": "<role>.host",
    "--port": "<role>.port",
    "--tp-size": "<role>.gpus",
    "--tp": "<role>.gpus",
    "--tensor-parallel-size": "<role>.gpus",  # the same setting as --tp-size under another name
    "--base-gpu-id": "<role>.gpus",
    "--gpu-id-step": "<role>.gpus",
    "--mem-fraction-static": "<role>.mem_fraction_static",
    "--chunked-prefill-size": "<role>.chunked_prefill_size",
    "--max-running-requests": "<role>.max_running_requests",
    "--disaggregation-mode": "the role itself",
    "--disaggregation-transfer-backend": "transfer.backend",
    "--disaggregation-bootstrap-port": "transfer.bootstrap_port",
    "--disaggregation-ib-device": "transfer.ib_devices",
    "--nnodes": "<role>.hosts (a multi-host deployment's multi-node server)",
    "--node-rank": "<role>.hosts (a multi-host deployment's multi-node server)",
    "--dist-init-addr": "<role>.dist_init_port (a multi-host deployment's multi-node server)",
    "--nccl-init-addr": "<role>.dist_init_port (a multi-host deployment's multi-node server)",  # its alias
}
RENDERED_ROUTER_FLAGS = {
    "--pd-disaggregation": "the deployment itself",
    "--prefill": "prefill.host/port (every prefill server)",
    "--decode": "decode.host/port (every decode server)",
    "--host": "router.host",
    "--port": "router.port",
    "--prometheus-host": "router.prometheus_host",
    "--prometheus-port": "router.prometheus_port",
    "--policy": "router.policy",
    "--prefill-policy": "router.prefill_policy",
    "--decode-policy": "router.decode_policy",
    "--health-check-timeout-secs": "router.health_check_timeout_secs",
    "--worker-startup-timeout-secs": "router.worker_startup_timeout_secs",
    "--request-timeout-secs": "router.request_timeout_secs",
    "--health-check-port": "router.health_check_port",
    "--upstream-pool-idle-timeout-secs": "router.upstream_pool_idle_timeout_secs",
    "--disable-circuit-breaker": "router.circuit_breaker",
    "--cb-failure-threshold": "router.cb_failure_threshold",
    "--cb-success-threshold": "router.cb_success_threshold",
    "--cb-timeout-duration-secs": "router.cb_timeout_duration_secs",
    "--retry-max-retries": "router.retry_max_retries",
    "--disable-retries": "router.retry_max_retries (1: no retry)",
    "--retry-initial-backoff-ms": "router.retry_initial_backoff_ms",
    "--retry-max-backoff-ms": "router.retry_max_backoff_ms",
    "--retry-backoff-multiplier": "router.retry_backoff_multiplier",
    "--retry-jitter-factor": "router.retry_jitter_factor",
    "--health-check-interval-secs": "router.health_check_interval_secs",
    "--health-failure-threshold": "router.health_failure_threshold",
    "--health-success-threshold": "router.health_success_threshold",
    "--prefill-max-inflight-requests-per-worker": "router.prefill_max_inflight_requests_per_worker",
    "--prefill-queue-size": "router.prefill_queue_size",
    "--prefill-queue-timeout-secs": "router.prefill_queue_timeout_secs",
    "--shutdown-grace-period-secs": "router.shutdown_grace_period_secs",
    "--reasoning-parser": "model.reasoning_parser (parsers belong on the SGLang servers)",
    "--tool-call-parser": "model.tool_call_parser (parsers belong on the SGLang servers)",
}


def _servers(dep: Deployment) -> Iterator[tuple[str, ServerSpec, int]]:
    """(where it is written, its settings, how many nodes) of every SGLang server, the fallback included."""
    for server in servers(dep):
        yield server.field, server.spec, server.nnodes
    if dep.fallback is not None:
        yield "fallback", dep.fallback, 1


def _one_host_workers(dep: Deployment) -> tuple[WorkerSpec, WorkerSpec] | None:
    """A single-host file's prefill and decode tables; None for any other shape (rules_hosts reports it)."""
    prefill, decode = dep.prefill, dep.decode
    if dep.multi_host or not isinstance(prefill, WorkerSpec) or not isinstance(decode, WorkerSpec):
        return None
    return prefill, decode


def gpu_layout(dep: Deployment) -> Iterator[Problem]:
    for role, server, nodes in _servers(dep):
        gpus = server.gpus
        if len(set(gpus)) != len(gpus):
            yield Problem(f"{role}.gpus", gpus, "lists a GPU twice", "list each GPU once")
            continue
        if server.tp_size is not None and server.tp_size != len(gpus) * nodes:
            yield Problem(
                f"{role}.tp_size",
                server.tp_size,
                f"differs from the number of GPUs in {role}.gpus ({len(gpus)})" if nodes == 1 else
                f"differs from the GPUs of its {nodes} nodes ({len(gpus)} in {role}.gpus on each: {len(gpus) * nodes})",
                f"set tp_size = {len(gpus) * nodes} or remove it (it defaults to "
                f"{'len(gpus)' if nodes == 1 else 'len(gpus) x len(hosts)'})",
            )
        # SGLang places ranks at base-gpu-id + i * gpu-id-step: only evenly spaced ascending sets fit.
        step = gpus[1] - gpus[0] if len(gpus) > 1 else 1
        if step < 1 or any(b - a != step for a, b in itertools.pairwise(gpus)):
            yield Problem(
                f"{role}.gpus",
                gpus,
                "is not an evenly spaced ascending list, which SGLang's --base-gpu-id/--gpu-id-step cannot express",
                "list GPUs as base, base+step, base+2*step, ... e.g. [4, 5, 6, 7]",
            )


def loopback_workers(dep: Deployment) -> Iterator[Problem]:
    workers = _one_host_workers(dep)
    if workers is None:
        # multi-host: placed servers listen on their host's cluster address: rules_hosts.listen_on_cluster_address
        return
    for role, worker in zip(WORKER_ROLES, workers, strict=True):
        if not is_loopback(worker.host) and not worker.allow_non_loopback:
            yield Problem(
                f"{role}.host",
                worker.host,
                "exposes a worker beyond this host; workers answer without the router's API key",
                f"use 127.0.0.1, or set {role}.allow_non_loopback = true if another host must reach it",
            )


def public_router_key(dep: Deployment) -> Iterator[Problem]:
    if not is_loopback(dep.router.host) and dep.router.api_key_file is None:
        yield Problem(
            "router.api_key_file",
            None,
            f"the router listens on {dep.router.host} without an API key: anyone who can reach it can use the model",
            "set router.api_key_file to a file holding the key (0600), or bind router.host to 127.0.0.1",
            Severity.WARNING,
        )


def context_fits_chunk(dep: Deployment) -> Iterator[Problem]:
    context = dep.model.context_length
    if context is None:
        return
    for role, server, _ in _servers(dep):
        chunk = server.chunked_prefill_size
        if chunk is not None and chunk > context:
            yield Problem(
                f"{role}.chunked_prefill_size",
                chunk,
                f"exceeds model.context_length ({context})",
                f"lower it to at most {context}, or raise model.context_length",
            )


def no_rendered_flags_in_extra_args(dep: Deployment) -> Iterator[Problem]:
    def clashes(field: str, args: list[str], rendered: dict[str, str], role: str) -> Iterator[Problem]:
        exact = ROUTER_EXACT_FLAGS if role == "router" else SERVER_EXACT_FLAGS
        for arg in args:
            # The parsers take any unambiguous prefix for the flag (`--por` is --port): see extra_args.py.
            flag = read_as(arg, rendered, exact)
            if flag:
                given = long_flag(arg)
                how = "" if given == flag else f" (the parser reads {given} as {flag})"
                yield Problem(
                    field, arg, f"{flag} is rendered by pdserve{how}",
                    f"set {rendered[flag].replace('<role>', role)} instead",
                )

    for role, server, _ in _servers(dep):
        yield from clashes(f"{role}.extra_args", server.extra_args, RENDERED_SERVER_FLAGS, role)
    yield from clashes("router.extra_args", dep.router.extra_args, RENDERED_ROUTER_FLAGS, "router")


def policy_choice(dep: Deployment) -> Iterator[Problem]:
    router = dep.router
    if router.policy and (router.prefill_policy or router.decode_policy):
        yield Problem(
            "router.policy",
            router.policy,
            "is set together with router.prefill_policy/decode_policy",
            "set either policy (both roles) or prefill_policy and decode_policy",
        )


RULES: tuple[Rule, ...] = (
    disjoint_gpus,
    gpu_layout,
    distinct_ports,
    loopback_workers,
    public_router_key,
    context_fits_chunk,
    no_rendered_flags_in_extra_args,
    policy_choice,
)


def validate(dep: Deployment, rules: Sequence[Rule] = RULES) -> list[Problem]:
    return [problem for rule in rules for problem in rule(dep)]
