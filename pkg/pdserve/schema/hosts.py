"""The `[hosts.<name>]` tables of a multi-host deployment: the machines, and what each one has.

A deployment file without `[hosts]` describes one host, implied (the reference deployment): everything in
it runs where it is rendered. With `[hosts]`, every server and the router name the host(s) they run on
(pdserve.schema.config.PlacedWorkerSpec, RouterSpec.hosts), and `pdserve render --host NAME` writes one
host's units. The rules that relate placements to hosts live in pdserve.schema.rules_hosts.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from pdserve.schema.addresses import cluster_address_problem
from pdserve.schema.fields import IB_DEVICE, MAX_LIST_ITEMS, UNIT_NAME, Count, Index, invalid


def _host_name(value: str) -> str:
    if not UNIT_NAME.fullmatch(value):
        raise invalid(
            "is not a host name pdserve can use: lowercase letters, digits and dashes (it becomes part of unit "
            "names and of `pdserve render --host`)",
            "e.g. [hosts.gpu-a]",
        )
    return value


HostName = Annotated[str, AfterValidator(_host_name)]


def _cluster_address(value: str) -> str:
    """An IP address other hosts reach (pdserve.schema.addresses.cluster_address_problem)."""
    problem = cluster_address_problem(value)
    if problem:
        raise invalid(*problem)
    return value


ClusterAddress = Annotated[str, AfterValidator(_cluster_address)]


def _ib_device(value: str) -> str:
    if not IB_DEVICE.fullmatch(value):
        raise invalid(f"{value!r} is not an RDMA device name (they are joined with ',' on the command line)",
                      "use names as `ibv_devices` lists them, e.g. mlx5_0")
    return value


IbDevice = Annotated[str, AfterValidator(_ib_device)]


# A host whose address is absent: what the model holds while the rules run on a file whose address was
# refused or left out (pdserve.schema.loading replaces a bad value by its default). The other rules then
# skip the host's address (topology.host_address gives None) instead of the whole file failing, so the
# file's other problems are reported with it; rules_hosts.addresses_given refuses a file that leaves it out.
ADDRESS_UNSET = ""


def _address_required(schema: dict[str, Any]) -> None:
    # The default exists only for the rules' pass above: the file must write the address.
    schema.setdefault("required", []).insert(0, "address")
    schema["properties"]["address"].pop("default", None)


class HostSpec(BaseModel):
    """One machine. Servers placed on it listen on its cluster address; the router, the peer role's KV
    transfer and the other nodes of a multi-node server reach them there."""

    # As every section of the deployment (pdserve.schema.config._Section): no coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, json_schema_extra=_address_required)

    address: ClusterAddress = Field(
        ADDRESS_UNSET, description="Cluster address: the IP address the other hosts of the deployment reach this one "
        "at; a routable unicast address (IPv4, or IPv6 in canonical form), not loopback, wildcard, broadcast, "
        "multicast, link-local or IPv4-mapped, without a zone ID (%...)")
    gpus: Count | None = Field(
        None, description="How many GPUs the host has (indices 0..gpus-1); placements are checked against it")
    numa_nodes: list[list[Index]] | None = Field(
        None, max_length=MAX_LIST_ITEMS,
        description="The GPUs attached to each NUMA node, node 0 first, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]] ([] for "
        "a node without GPUs); a server's numa_node is checked against it")
    ib_devices: list[IbDevice] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS,
        description="RDMA devices of this host as `ibv_devices` lists them (e.g. mlx5_0); a server placed here may "
        "only name these")

