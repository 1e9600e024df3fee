"""The host's NUMA topology from sysfs: which nodes exist, their CPUs, and the node a PCI device sits on."""

from __future__ import annotations

import re
from pathlib import Path

from pdserve.probes.cpulist import parse_list

SYS = Path("/sys")
_NODE_DIR = re.compile(r"node(\d+)")


def numa_nodes(sys_root: Path = SYS) -> list[int] | None:
    """The NUMA node numbers, or None when sysfs does not list them (no /sys, a kernel without NUMA)."""
    nodes_dir = sys_root / "devices/system/node"
    try:
        entries = list(nodes_dir.iterdir())
    except OSError:
        return None
    return sorted(int(m.group(1)) for p in entries if (m := _NODE_DIR.fullmatch(p.name)))


def node_cpus(node: int, sys_root: Path = SYS) -> frozenset[int] | None:
    """The CPUs of one node, or None when the node is not there."""
    try:
        return parse_list((sys_root / f"devices/system/node/node{node}/cpulist").read_text())
    except OSError:
        return None


def sysfs_pci_address(bus_id: str) -> str:
    """NVML and nvidia-smi write the PCI address with an 8-digit domain in capitals (00000000:3B:00.0);
    sysfs names the device 0000:3b:00.0."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def pci_numa_node(bus_id: str, sys_root: Path = SYS) -> int | None:
    """The NUMA node of a PCI device, or None when the kernel does not say (-1: no affinity known)."""
    try:
        node = int((sys_root / "bus/pci/devices" / sysfs_pci_address(bus_id) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
