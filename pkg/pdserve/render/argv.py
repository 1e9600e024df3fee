"""What each role runs: argv, environment and NUMA binding. Pure functions of the deployment.

The unit renderer, `pdserve plan`, the parser check and the GPU test tier all take their command
lines from here, so there is exactly one place that decides what SGLang and the router are given.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace

from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import ROLES, WORKER_ROLES, Deployment, FallbackSpec, Role, ServerSpec
from pdserve.schema.derived import API_KEY_CREDENTIAL, router_shutdown_grace, unit_name, url_of
from pdserve.schema.fields import DSA_KERNELS_ENV
from pdserve.schema.topology import Node, host_address, nodes_on, router_hosts, router_unit, server_unit, servers

# The modules the SGLang Python runs: SGLang's server, and the router (smg, pdserve.schema.pins).
SERVER_MODULE = "sglang.launch_server"
ROUTER_MODULE = "smg.launch_router"


@dataclass(frozen=True)
class NumaBinding:
    cpu_node: int
    memory_node: int

    def numactl_args(self) -> list[str]:
        return [f"--cpunodebind={self.cpu_node}", f"--membind={self.memory_node}", "--"]


@dataclass(frozen=True)
class Launch:
    """One role's process: the full argv (numactl prefix included), its environment, and secrets."""

    role: Role
    unit: str
    argv: tuple[str, ...]
    env: dict[str, str]
    numa: NumaBinding | None
    url: str
    # credential name -> host file; the process reads it from $CREDENTIALS_DIRECTORY/<name>.
    credentials: dict[str, str]
    # Multi-host files (pdserve.render.units on a named host): the server (its name) and node this process is.
    server: str | None = None
    node_rank: int = 0


def _gpu_placement(server: ServerSpec) -> list[str]:
    gpus = server.gpus
    step = gpus[1] - gpus[0] if len(gpus) > 1 else 1
    args = ["--tp-size", str(server.tensor_parallel), "--base-gpu-id", str(gpus[0])]
    if step != 1:
        args += ["--gpu-id-step", str(step)]
    return args


def _model_args(dep: Deployment) -> list[str]:
    model = dep.model
    args = ["--model-path", model.path]
    if model.served_name:
        args += ["--served-model-name", model.served_name]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if model.context_length:
        args += ["--context-length", str(model.context_length)]
    if model.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", model.kv_cache_dtype]
    # Parsers go on every SGLang server: the router proxies PD traffic without parsing it.
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    if model.tool_call_parser:
        args += ["--tool-call-parser", model.tool_call_parser]
    if model.chat_template:
        args += ["--chat-template", model.chat_template]
    return args


def _capacity_args(server: ServerSpec) -> list[str]:
    # repr: the shortest text that reads back as the same float (`:g` would round 0.9999999999999999 to 1).
    args = ["--mem-fraction-static", repr(server.mem_fraction_static)]
    if server.chunked_prefill_size:
        args += ["--chunked-prefill-size", str(server.chunked_prefill_size)]
    if server.max_running_requests:
        args += ["--max-running-requests", str(server.max_running_requests)]
    return args


def _fallback(dep: Deployment) -> FallbackSpec:
    if dep.fallback is None:
        raise ValueError(f"deployment {dep.name} has no fallback (a multi-host deployment runs none)")
    return dep.fallback


def server_args(dep: Deployment, role: Role) -> list[str]:
    """SGLang server flags of a single-host file's role (prefill, decode or fallback), as `launch_server`
    takes them (node_args: any server of any layout)."""
    if role == "router":
        raise ValueError("the router is not an SGLang server; use router_args()")
    if role == "fallback":
        fallback = _fallback(dep)
        args = [*_model_args(dep), "--host", dep.fallback_host, "--port", str(dep.fallback_port)]
        return _closing_args([*args, *_gpu_placement(fallback), *_capacity_args(fallback)], fallback)
    return node_args(dep, Node(servers(dep, role)[0], 0))


def _multi_node_args(dep: Deployment, node: Node) -> list[str]:
    server = node.server
    if server.nnodes == 1:
        return []
    # torch's TCPStore on node 0; every node of the server connects there to form the TP group.
    init = url_of(host_address(dep, server.hosts[0]) or server.listen_host, server.dist_init_port or 0)
    return ["--nnodes", str(server.nnodes), "--node-rank", str(node.rank),
            "--dist-init-addr", init.removeprefix("http://")]


def node_args(dep: Deployment, node: Node) -> list[str]:
    """SGLang server flags of one node of a PD server: node 0 serves HTTP on the listen address; the
    others of a multi-node server listen on their own host's address (SGLang serves nothing there)."""
    server = node.server
    host = server.listen_host if node.rank == 0 else (host_address(dep, node.host) or server.listen_host)
    args = [*_model_args(dep), "--host", host, "--port", str(server.port)]
    args += _gpu_placement(server.spec)
    args += _multi_node_args(dep, node)
    args += _capacity_args(server.spec)
    args += ["--disaggregation-mode", server.role, "--disaggregation-transfer-backend", dep.transfer.backend]
    if server.bootstrap_port is not None:
        # Only a prefill binds a bootstrap server; decode learns the port from the router.
        args += ["--disaggregation-bootstrap-port", str(server.bootstrap_port)]
    if server.ib_devices:
        args += ["--disaggregation-ib-device", ",".join(server.ib_devices)]
    return _closing_args(args, server.spec)


def _closing_args(args: list[str], spec: ServerSpec) -> list[str]:
    # /metrics for Prometheus scrapes (the verifier itself reads KV capacity from /server_info).
    return [*args, "--enable-metrics", *spec.extra_args]


def router_args(dep: Deployment) -> list[str]:
    """The router's flags for PD mode, as `smg.launch_router` takes them. Every setting pdserve has a
    default for is written out, so another smg release's defaults change nothing unseen."""
    router = dep.router
    args = ["--pd-disaggregation"]
    # Every server of the deployment: each router is a full view (a prefill with its bootstrap port).
    for server in servers(dep):
        args += [f"--{server.role}", server.url]
        args += [str(server.bootstrap_port)] if server.bootstrap_port is not None else []
    args += [
        "--host", router.host,
        "--port", str(router.port),
        "--prometheus-host", router.prometheus_host,
        "--prometheus-port", str(router.prometheus_port),
    ]
    if router.health_check_port is not None:
        args += ["--health-check-port", str(router.health_check_port)]
    for flag, policy in (
        ("--policy", router.policy),
        ("--prefill-policy", router.prefill_policy),
        ("--decode-policy", router.decode_policy),
    ):
        if policy:
            args += [flag, policy]
    args += [
        "--worker-startup-timeout-secs", str(router.worker_startup_timeout_secs),
        "--request-timeout-secs", str(router.request_timeout_secs),
        "--upstream-pool-idle-timeout-secs", str(router.upstream_pool_idle_timeout_secs),
    ]
    args += router_resilience_args(dep)
    args += router.extra_args
    return args


def router_resilience_args(dep: Deployment) -> list[str]:
    """How the router meets a worker's crash, hiccup and restart, and how it stops (see
    pdserve.schema.router): health checks decide when a worker is out and back, retries ride over what is
    shorter, the breaker (off by default) and the admission queue (unset by default) as the deployment
    says, and a drain that ends before systemd's SIGKILL."""
    router = dep.router
    args = [
        "--health-check-timeout-secs", str(router.health_check_timeout_secs),
        "--health-check-interval-secs", str(router.health_check_interval_secs),
        "--health-failure-threshold", str(router.health_failure_threshold),
        "--health-success-threshold", str(router.health_success_threshold),
        "--retry-max-retries", str(router.retry_max_retries),
        "--retry-initial-backoff-ms", str(router.retry_initial_backoff_ms),
        "--retry-max-backoff-ms", str(router.retry_max_backoff_ms),
        # repr: the shortest text that reads back as the same float.
        "--retry-backoff-multiplier", repr(router.retry_backoff_multiplier),
        "--retry-jitter-factor", repr(router.retry_jitter_factor),
    ]
    if router.circuit_breaker:
        args += [
            "--cb-failure-threshold", str(router.cb_failure_threshold),
            "--cb-success-threshold", str(router.cb_success_threshold),
            "--cb-timeout-duration-secs", str(router.cb_timeout_duration_secs),
        ]
    else:
        args.append("--disable-circuit-breaker")
    for flag, value in (
        ("--prefill-max-inflight-requests-per-worker", router.prefill_max_inflight_requests_per_worker),
        ("--prefill-queue-size", router.prefill_queue_size),
        ("--prefill-queue-timeout-secs", router.prefill_queue_timeout_secs),
    ):
        if value is not None:
            args += [flag, str(value)]
    return [*args, "--shutdown-grace-period-secs", str(router_shutdown_grace(dep))]


def numa_binding(spec: ServerSpec) -> NumaBinding | None:
    """Where an SGLang server's CPUs and memory are bound: its numa_node, or nowhere."""
    return None if spec.numa_node is None else NumaBinding(spec.numa_node, spec.numa_node)


def sglang_environment(dep: Deployment, spec: ServerSpec) -> dict[str, str]:
    """An SGLang server's environment: the deployment's, then the server's own settings."""
    # Always rendered, "sglang" included: an explicit off, so a value inherited from elsewhere (the
    # manager's environment, a drop-in's) cannot turn pdserve's kernels on behind the deployment's back.
    return {**dep.environment, **spec.env, DSA_KERNELS_ENV: spec.attention_kernels}


# What follows the SGLang environment's bin directory on a server's PATH unless the deployment sets PATH:
# systemd's own search path for services (with /sbin and /bin, for hosts whose /usr is not merged).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def server_environment(env: dict[str, str], tools: Toolchain) -> dict[str, str]:
    """An SGLang server's environment with the SGLang Python's own directory first on PATH. FlashInfer
    JIT-builds kernels at the first forward and runs `ninja` by name; a virtual environment (or a Nix
    python env) has it beside its python, in a directory no system PATH holds, so without this the server
    dies at its first CUDA-graph capture (GPU tier under systemd, H100, 2026-12-05). A PATH the deployment
    sets follows that directory; otherwise systemd's default does."""
    directory = posixpath.dirname(tools.sglang_python)
    if not directory:  # `pdserve plan`'s placeholder for an SGLang Python nobody named: no directory to show
        return env
    return {**env, "PATH": f"{directory}:{env.get('PATH', SYSTEM_PATH)}"}


def launch(dep: Deployment, role: Role, tools: Toolchain) -> Launch:
    """A single-host file's process of `role` (a prefill or decode: its server's node 0, node_launch). Only
    the router and the fallback hold the API key, when there is one. Each router of a multi-host file runs
    this router's process under its own unit name (pdserve.render.units.placed_launch)."""
    if role in WORKER_ROLES:
        return node_launch(dep, Node(servers(dep, role)[0], 0), tools)
    keyed = dep.router.api_key_file is not None
    if role == "router":
        entry, args, target = ["-m", ROUTER_MODULE], router_args(dep), "router"
        binding, env = None, dict(dep.router.env)
        url = url_of(dep.router.host, dep.router.port)
    else:
        fallback = _fallback(dep)
        entry, args, target = ["-m", SERVER_MODULE], server_args(dep, role), "server"
        binding, env = numa_binding(fallback), server_environment(sglang_environment(dep, fallback), tools)
        url = url_of(dep.fallback_host, dep.fallback_port)
    if keyed:
        # The key is read from the credential inside the process, so it never shows in argv (ps).
        entry = [tools.keyed_launcher, target, API_KEY_CREDENTIAL, "--"]
    prefix = [tools.numactl, *binding.numactl_args()] if binding else []
    credentials = {API_KEY_CREDENTIAL: dep.router.api_key_file} if keyed and dep.router.api_key_file else {}
    return Launch(role=role, unit=unit_name(dep, role), argv=(*prefix, tools.sglang_python, *entry, *args), env=env,
                  numa=binding, url=url, credentials=credentials)


def launches(dep: Deployment, tools: Toolchain) -> dict[Role, Launch]:
    """A single-host file's four processes (host_launches: one host of a multi-host file)."""
    return {role: launch(dep, role, tools) for role in ROLES}


def node_launch(dep: Deployment, node: Node, tools: Toolchain) -> Launch:
    """One node of a PD server. Workers never hold the API key: only the router and the fallback do."""
    server = node.server
    binding = numa_binding(server.spec)
    prefix = [tools.numactl, *binding.numactl_args()] if binding else []
    # Node 0 serves the API; the others only SGLang's health-only server, on their own address.
    url = server.url if node.rank == 0 else url_of(host_address(dep, node.host) or server.listen_host, server.port)
    return Launch(
        role=server.role, unit=server_unit(dep, node),
        argv=(*prefix, tools.sglang_python, "-m", SERVER_MODULE, *node_args(dep, node)),
        env=server_environment(sglang_environment(dep, server.spec), tools), numa=binding, url=url,
        credentials={},
        server=server.name, node_rank=node.rank,
    )


def host_launches(dep: Deployment, host: str, tools: Toolchain) -> list[Launch]:
    """The processes one host of a multi-host deployment runs: its server nodes, then its router."""
    found = [node_launch(dep, node, tools) for node in nodes_on(dep, host)]
    if host in router_hosts(dep):
        found.append(replace(launch(dep, "router", tools), unit=router_unit(dep, host)))
    return found
