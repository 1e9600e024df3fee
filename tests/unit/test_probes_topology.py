"""NUMA topology from sysfs: a tree built by hand, and this machine's own /sys."""

from __future__ import annotations

import os
from pathlib import Path

from pdserve.probes.topology import node_cpus, numa_nodes, pci_numa_node, sysfs_pci_address


def test_nodes_cpus_and_a_devices_node_from_a_sysfs_tree(tmp_path: Path):
    for node, cpus in ((0, "0-31,64-95\n"), (1, "32-63,96-127\n")):
        (tmp_path / f"devices/system/node/node{node}").mkdir(parents=True)
        (tmp_path / f"devices/system/node/node{node}/cpulist").write_text(cpus)
    (tmp_path / "devices/system/node/online").write_text("0-1\n")
    for address, node in (("0000:3b:00.0", "1"), ("0000:5e:00.0", "-1")):
        (tmp_path / "bus/pci/devices" / address).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / address / "numa_node").write_text(f"{node}\n")
    assert numa_nodes(tmp_path) == [0, 1]
    assert node_cpus(1, tmp_path) == frozenset(range(32, 64)) | frozenset(range(96, 128))
    assert node_cpus(2, tmp_path) is None
    assert pci_numa_node("00000000:3B:00.0", tmp_path) == 1  # NVML's spelling
    assert pci_numa_node("00000000:5E:00.0", tmp_path) is None  # the kernel says -1: not known
    assert pci_numa_node("00000000:AF:00.0", tmp_path) is None  # no such device
    assert numa_nodes(tmp_path / "absent") is None


def test_pci_addresses_in_sysfs_spelling():
    assert sysfs_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_pci_address("0000:3b:00.0") == "0000:3b:00.0"


def test_this_machines_sysfs():
    """Every CPU this process may run on belongs to one of the nodes sysfs lists."""
    nodes = numa_nodes()
    if nodes is None:
        assert not Path("/sys/devices/system/node").is_dir()
        return
    assert nodes and all(n >= 0 for n in nodes)
    on_nodes = frozenset().union(*(node_cpus(n) or frozenset() for n in nodes))
    assert os.sched_getaffinity(0) <= on_nodes
