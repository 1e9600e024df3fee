"""What a healthy deployment looks like from outside: derived from the deployment config, nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.render.monitoring.targets import targets
from pdserve.schema import pins
from pdserve.schema.config import WORKER_ROLES, Deployment, Role
from pdserve.schema.derived import disaggregation_mode, role_url, unit_name

# A server that cannot hold one request of the default context is unusable; the floor defaults to it.
DEFAULT_KV_FLOOR = 65536
METRICS_ROLES = ("prefill", "decode", "router")  # the PD layout's; the fallback's /metrics answers only in single


@dataclass(frozen=True)
class WorkerExpectation:
    role: Role
    unit: str
    url: str
    host: str
    port: int
    mode: str
    gpus: tuple[int, ...]
    tp_size: int
    mem_fraction_static: float
    chunked_prefill_size: int | None
    numa_node: int | None
    allow_non_loopback: bool


@dataclass(frozen=True)
class Expectations:
    name: str
    served_model: str
    context_length: int | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    workers: dict[str, WorkerExpectation]
    router_url: str
    router_host: str
    router_unit: str
    fallback_unit: str
    bootstrap_port: int
    api_key_file: str | None
    kv_floor: int
    sglang_version: str = pins.SGLANG_VERSION
    router_version: str = pins.SGLANG_ROUTER_VERSION
    # role -> the /metrics URL Prometheus scrapes (prefill, decode, and the router's Prometheus listener)
    metrics_urls: dict[str, str] = field(default_factory=dict)

    @property
    def pd_units(self) -> dict[str, str]:
        return {**{role: w.unit for role, w in self.workers.items()}, "router": self.router_unit}


def expectations(dep: Deployment, kv_floor: int | None = None) -> Expectations:
    workers = {}
    for role in WORKER_ROLES:
        spec = dep.worker(role)
        workers[role] = WorkerExpectation(
            role=role,
            unit=unit_name(dep, role),
            url=role_url(dep, role),
            host=spec.host,
            port=spec.port,
            mode=disaggregation_mode(role),
            gpus=tuple(spec.gpus),
            tp_size=spec.tensor_parallel,
            mem_fraction_static=spec.mem_fraction_static,
            chunked_prefill_size=spec.chunked_prefill_size,
            numa_node=spec.numa_node,
            allow_non_loopback=spec.allow_non_loopback,
        )
    model = dep.model
    return Expectations(
        name=dep.name,
        served_model=model.served_name or model.path,
        context_length=model.context_length,
        reasoning_parser=model.reasoning_parser,
        tool_call_parser=model.tool_call_parser,
        workers=workers,
        router_url=role_url(dep, "router"),
        router_host=dep.router.host,
        router_unit=unit_name(dep, "router"),
        fallback_unit=unit_name(dep, "fallback"),
        bootstrap_port=dep.transfer.bootstrap_port,
        api_key_file=dep.router.api_key_file,
        kv_floor=kv_floor if kv_floor is not None else (model.context_length or DEFAULT_KV_FLOOR),
        metrics_urls={t.role: f"http://{t.address}/metrics" for t in targets(dep) if t.role in METRICS_ROLES},
    )
