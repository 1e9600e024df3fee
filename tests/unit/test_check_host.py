"""What `pdserve check` sees of a host, on host views built by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.check.host import HostView, check_host
from pdserve.probes import paths
from pdserve.render.toolchain import Toolchain


@pytest.fixture
def real_tools(tmp_path: Path) -> Toolchain:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "numactl", "pdserve"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return Toolchain(str(bin_dir / "python"), str(bin_dir / "numactl"), str(bin_dir / "pdserve"))


def eight_gpus(numa: dict[int, int | None]) -> HostView:
    return HostView([f"00000000:{i:02X}:00.0" for i in range(8)], [0, 1], numa)


def test_small_host_names_missing_gpus_and_nodes(reference, real_tools):
    four = HostView([f"00000000:{i:02X}:00.0" for i in range(4)], [0], {0: 0, 1: 0, 2: None, 3: None})
    report = check_host(reference, real_tools, four)
    fields = {p.field: p for p in report.problems}
    assert "GPU(s) [4, 5, 6, 7] do not exist: this host has 4" in fields["decode.gpus"].message
    assert fields["decode.numa_node"].message == "this host has NUMA nodes [0]"
    assert any("GPU NUMA affinity unknown" in reason for reason in report.skipped)
    assert "tools.numactl" not in fields


def test_reference_host_layout_passes(reference, real_tools):
    report = check_host(reference, real_tools, eight_gpus({g: g // 4 for g in range(8)}))
    # No model on this machine: a warning; nor, on most, the units' user pdserve: another (check.access).
    no_user = isinstance(paths.account("pdserve", "pdserve", []), str)
    assert [p.field for p in report.problems] == ["model.path"] + (["systemd.user"] if no_user else [])
    assert "GPU indices exist (8 GPUs)" in report.passed


def test_gpus_on_the_wrong_numa_node_warn(reference, real_tools):
    report = check_host(reference, real_tools, eight_gpus({g: 1 - g // 4 for g in range(8)}))
    warning = next(p for p in report.problems if p.field == "prefill.numa_node")
    assert "sit on NUMA node(s) [1], not 0" in warning.message


def test_unknown_gpu_affinity_is_a_skip_not_a_pass(reference, real_tools):
    report = check_host(reference, real_tools, eight_gpus(dict.fromkeys(range(8))))
    assert not any(p.field.endswith("numa_node") for p in report.problems)
    assert sum("GPU NUMA affinity unknown" in reason for reason in report.skipped) == 2


def test_no_nvml_is_a_stated_skip(reference, real_tools):
    report = check_host(reference, real_tools, HostView(None, [0, 1], {}, "NVML is not available on this host: x"))
    assert "GPU count and GPU NUMA affinity: NVML is not available on this host: x" in report.skipped


def sysfs(root: Path, nodes: list[int], devices: dict[str, str]) -> Path:
    """A /sys with the NUMA nodes and PCI devices' numa_node files the host check reads."""
    for node in nodes:
        (root / f"devices/system/node/node{node}").mkdir(parents=True)
    (root / "devices/system/node/possible").write_text("0-1\n")  # a file beside the node dirs, as in sysfs
    for address, node in devices.items():
        (root / "bus/pci/devices" / address).mkdir(parents=True)
        (root / "bus/pci/devices" / address / "numa_node").write_text(f"{node}\n")
    return root


def test_read_host_takes_the_gpus_from_nvml_and_their_nodes_from_sysfs(tmp_path):
    from pdserve.check.host import read_host
    from pdserve.probes.observations import GpuObs, Unavailable

    root = sysfs(tmp_path, [0, 1], {"0000:3b:00.0": "0", "0000:d8:00.0": "1", "0000:5e:00.0": "-1"})
    # NVML's own spelling of the PCI address: 8-digit domain, capitals.
    gpus = [GpuObs(i, "NVIDIA H200", 0, 1, (), bus) for i, bus in
            enumerate(["00000000:3B:00.0", "00000000:5E:00.0", "00000000:D8:00.0"])]
    host = read_host(root, lambda: list(reversed(gpus)))
    assert host.gpu_bus_ids == ["00000000:3B:00.0", "00000000:5E:00.0", "00000000:D8:00.0"]
    assert host.numa_nodes == [0, 1] and host.gpu_numa == {0: 0, 1: None, 2: 1}

    def no_nvml():
        raise Unavailable("NVML is not available on this host: Driver Not Loaded")

    unknown = read_host(root, no_nvml)
    assert unknown.gpu_bus_ids is None and "Driver Not Loaded" in unknown.gpus_unknown
    assert read_host(tmp_path / "absent", no_nvml).numa_nodes is None


def test_missing_tools_and_open_key_file(reference_data, real_tools, tmp_path):
    from pdserve.schema.loading import deployment_from_data

    key = tmp_path / "router.key"
    key.write_text("sk-test\n")
    key.chmod(0o644)
    reference_data["router"]["api_key_file"] = str(key)
    dep = deployment_from_data(reference_data, "t").deployment
    broken = Toolchain(real_tools.sglang_python, "/nonexistent/numactl", real_tools.pdserve)
    report = check_host(dep, broken, eight_gpus({g: g // 4 for g in range(8)}))
    fields = {p.field: p for p in report.problems}
    assert fields["tools.numactl"].message == "is not an executable file on this host"
    assert fields["router.api_key_file"].fix == f"chmod 600 {key}"
