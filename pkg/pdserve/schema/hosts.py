"""The `[hosts.<name>]` tables of a multi-host deployment: the machines, and what each one has.

A deployment file without `[hosts]` describes one host, implied (the reference deployment): everything in
it runs where it is rendered. With `[hosts]`, every server and the router name the host(s) they run on
(pdserve.schema.config.PlacedWorkerSpec, RouterSpec.hosts), and `pdserve render --host NAME` writes one
host's units. The rules that relate placements to hosts live in pdserve.schema.rules_hosts.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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
    """An IP address other hosts reach: the firewall rules match it, --dist-init-addr and the router's
    worker URLs carry it, so a name (resolved differently per host, or not at all at boot) is refused."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise invalid(
            "is not an IP address",
            "write the IP address the other hosts reach this host at, e.g. 10.0.0.1 (the firewall rules and "
            "--dist-init-addr need an address, not a name)",
        ) from None
    if address.is_loopback or address.is_unspecified or address.is_multicast:
        kind = "a loopback" if address.is_loopback else ("a wildcard" if address.is_unspecified else "a multicast")
        raise invalid(
            f"is {kind} address; the servers placed on this host listen on it, and the other hosts must reach them there",
            "write this host's own address on the cluster network, e.g. 10.0.0.1",
        )
    return str(address)


ClusterAddress = Annotated[str, AfterValidator(_cluster_address)]


def _ib_device(value: str) -> str:
    if not IB_DEVICE.fullmatch(value):
        raise invalid(f"{value!r} is not an RDMA device name (they are joined with ',' on the command line)",
                      "use names as `ibv_devices` lists them, e.g. mlx5_0")
    return value


IbDevice = Annotated[str, AfterValidator(_ib_device)]


class HostSpec(BaseModel):
    """One machine. Servers placed on it listen on its cluster address; the router, the peer role's KV
    transfer and the other nodes of a multi-node server reach them there."""

    # As every section of the deployment (pdserve.schema.config._Section): no coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    address: ClusterAddress = Field(
        description="Cluster address: the IP address the other hosts of the deployment reach this one at")
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

