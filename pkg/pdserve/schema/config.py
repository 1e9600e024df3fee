"""The deployment schema: one pydantic model that every part of pdserve reads.

Field rules that need only one field live here (types, ranges, parser names, path shapes); rules that
relate several fields (disjoint GPUs, distinct ports, ...) live in `pdserve.schema.rules`, so each rule is
reported with every other problem rather than stopping at the first.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from pdserve.schema import fields
from pdserve.schema.fields import (
    IB_DEVICE,
    MAX_LIST_ITEMS,
    UNIT_NAME,
    Count,
    Environment,
    ExtraArgs,
    Fraction,
    Host,
    Index,
    Port,
    Seconds,
    UnitName,
    UserName,
    invalid,
)
from pdserve.schema.hosts import HostName, HostSpec, IbDevice
from pdserve.schema.model import ModelSpec
from pdserve.schema.monitoring import MonitoringSpec
from pdserve.schema.router import Policy, RouterSpec  # noqa: F401 - read from here too
from pdserve.schema.tools import ToolPaths, venv_python  # noqa: F401 - venv_python is read from here too

Role = Literal["prefill", "decode", "router", "fallback"]
WORKER_ROLES: tuple[Role, ...] = ("prefill", "decode")
ROLES: tuple[Role, ...] = ("prefill", "decode", "router", "fallback")
SERVER_ROLES: tuple[Role, ...] = ("prefill", "decode", "fallback")  # the SGLang servers (not the router)


class _Section(BaseModel):
    # strict: no coercion (`port = true` is not port 1, `"8000"` is not 8000, 1800.0 is not 1800).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServerSpec(_Section):
    """Settings shared by every SGLang server pdserve launches (prefill, decode, fallback)."""

    gpus: list[Index] = Field(min_length=1, max_length=MAX_LIST_ITEMS, description="GPU indices (PCI bus order)")
    numa_node: Index | None = Field(
        None, description="Bind CPUs and memory to this NUMA node with numactl; unset means no binding"
    )
    tp_size: Count | None = Field(None, description="Tensor parallel size; must equal len(gpus)")
    mem_fraction_static: Fraction = 0.85
    chunked_prefill_size: Count | None = None
    max_running_requests: Count | None = None
    extra_args: ExtraArgs = Field(default_factory=list, description="Further SGLang flags, verbatim")
    env: Environment = Field(default_factory=dict, description="Environment for this server only")
    attention_kernels: fields.AttentionKernels = "sglang"

    @property
    def tensor_parallel(self) -> int:
        return self.tp_size or len(self.gpus)


class WorkerSpec(ServerSpec):
    """A prefill or decode server. Workers listen on loopback: only the router is public."""

    host: Host = "127.0.0.1"
    port: Port
    allow_non_loopback: bool = Field(
        False, description="Permit a non-loopback host (workers then bypass the router's API key)"
    )


class PlacedWorkerSpec(ServerSpec):
    """A prefill or decode server of a multi-host deployment (`[[prefill]]`, `[[decode]]`): on one host, or
    on several as one multi-node tensor-parallel server (SGLang's --nnodes/--node-rank/--dist-init-addr)."""

    name: str | None = Field(None, description="Names its units: sglang-<deployment>-<name>; default <role>-<n>, "
                             "n counting the role's servers from 1 in file order")
    hosts: list[HostName] = Field(min_length=1, max_length=MAX_LIST_ITEMS, description="The host(s) it runs on: "
                                  "one, or several for multi-node TP (node rank = position; the first serves HTTP)")
    host: Host | None = Field(None, description="Listen address; defaults to, and must be, the first host's address")
    port: Port
    dist_init_port: Port | None = Field(None, description="Multi-node servers only: --dist-init-addr is the first "
                                        "host's address and this port; SGLang also binds the 6 ports above it")
    bootstrap_port: Port | None = Field(None, description="Prefill only: the KV bootstrap port it binds; defaults "
                                        "to transfer.bootstrap_port")
    ib_devices: list[IbDevice] | None = Field(None, max_length=MAX_LIST_ITEMS, description="Its "
                                              "--disaggregation-ib-device entries; default transfer.ib_devices")

    @field_validator("name")
    @classmethod
    def _unit_safe_name(cls, value: str | None) -> str | None:
        if value is not None and not UNIT_NAME.fullmatch(value):
            raise invalid("must be lowercase letters, digits and dashes (it becomes part of unit names)",
                          "e.g. name = \"decode-big\"")
        return value

    @property
    def tensor_parallel(self) -> int:
        # SGLang's --tp-size counts every node's GPUs: the same gpus on each host.
        return self.tp_size or len(self.gpus) * len(self.hosts)


def _table_or_array(value: object) -> str:
    return "array" if isinstance(value, list) else "table"


# `[prefill]` (one server, on the one implied host) or `[[prefill]]` (servers placed on [hosts]); the
# tag is the TOML shape, so an error names the fields of the shape that was written, not of both.
RoleServers = Annotated[
    Annotated[WorkerSpec, Tag("table")] | Annotated[list[PlacedWorkerSpec], Tag("array")],
    Discriminator(_table_or_array),
]
SHAPE_TAGS = ("table", "array")


class FallbackSpec(ServerSpec):
    """The single-server layout, installed disabled; it takes the router's place when cut over."""

    host: Host | None = Field(None, description="Listen address; defaults to router.host")
    port: Port | None = Field(None, description="Listen port; defaults to router.port")


class TransferSpec(_Section):
    """How KV moves from prefill to decode."""

    # `--disaggregation-transfer-backend` choices of sglang 0.5.23, less "fake" (a decode-only test backend).
    backend: Literal["nixl", "mooncake", "mooncake_tcp", "mori", "ascend"] = "nixl"
    bootstrap_port: Port = Field(8998, description="Bound by the prefill server; distinct per deployment")
    ib_devices: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS,
                                  description="--disaggregation-ib-device entries")

    @field_validator("ib_devices")
    @classmethod
    def _device_names(cls, value: list[str]) -> list[str]:
        for device in value:
            if not IB_DEVICE.fullmatch(device):
                raise invalid(f"{device!r} is not an RDMA device name (they are joined with ',' on the command line)",
                               "use names as `ibv_devices` lists them, e.g. mlx5_0")
        return value


class SystemdSpec(_Section):
    """How the units behave. Large models load for many minutes, hence the long start timeout."""

    start_timeout_sec: Seconds = Field(1800, description="TimeoutStartSec: launch until ready")
    stop_timeout_sec: Seconds = Field(120, description="TimeoutStopSec: SIGTERM until SIGKILL")
    restart_sec: Seconds = Field(10, description="RestartSec after a failure")
    start_limit_burst: Count = Field(5, description="Failed starts allowed within the interval")
    start_limit_interval_sec: Seconds = Field(3600, description="StartLimitIntervalSec")
    user: UserName = "pdserve"
    group: UserName = "pdserve"
    supplementary_groups: list[UserName] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    wanted_by: UnitName = "multi-user.target"


class Deployment(_Section):
    """One PD deployment: prefill + decode + router, and the single-server fallback."""

    name: str = Field(description="Unit names derive from it: sglang-<name>-prefill, ...")
    model: ModelSpec
    hosts: dict[HostName, HostSpec] = Field(
        default_factory=dict, max_length=MAX_LIST_ITEMS,
        description="The machines of a multi-host deployment (`[hosts.<name>]`); unset: one host, implied, where "
        "the units are rendered. With hosts, prefill and decode are arrays of servers placed on them")
    prefill: RoleServers = Field(description="One [prefill] table (one host), or [[prefill]] servers placed on [hosts]")
    decode: RoleServers = Field(description="One [decode] table (one host), or [[decode]] servers placed on [hosts]")
    allow_shared_gpus: bool = Field(
        False,
        description="Permit prefill and decode on the same GPU(s), for small test rigs; their "
        "mem_fraction_static values must then add up to at most 0.9. Production layouts keep them disjoint",
    )
    transfer: TransferSpec = Field(default_factory=TransferSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    environment: Environment = Field(
        default_factory=dict, description="Pinned environment of every SGLang server (CUDA, NCCL, UCX, SGLANG_*)"
    )
    fallback: FallbackSpec | None = Field(
        None, description="Required on one host; a multi-host deployment has none")
    systemd: SystemdSpec = Field(default_factory=SystemdSpec)
    boot_layout: Literal["pd", "single"] = Field(
        "pd",
        description="Which layout starts at boot: pd (prefill, decode and router WantedBy=systemd.wanted_by) "
        "or single (only the fallback). `pdserve cutover` switches what runs now; this decides what boots",
    )
    tools: ToolPaths = Field(default_factory=ToolPaths)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)

    @field_validator("name")
    @classmethod
    def _unit_safe_name(cls, value: str) -> str:
        if not UNIT_NAME.fullmatch(value):
            raise invalid(
                "must be lowercase letters, digits and dashes (it becomes part of unit names)",
                "e.g. name = \"dsv4\"",
            )
        return value

    @property
    def multi_host(self) -> bool:
        return bool(self.hosts)

    @property
    def fallback_host(self) -> str:
        return (self.fallback.host if self.fallback else None) or self.router.host

    @property
    def fallback_port(self) -> int:
        return (self.fallback.port if self.fallback else None) or self.router.port
