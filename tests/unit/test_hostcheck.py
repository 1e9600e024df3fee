"""What `pdserve check` sees of a host, on host views built by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.check.host import HostView, check_host
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
    assert [p.field for p in report.problems] == ["model.path"]  # no model on this machine: a warning
    assert "GPU indices exist (8 GPUs)" in report.passed


def test_gpus_on_the_wrong_numa_node_warn(reference, real_tools):
    report = check_host(reference, real_tools, eight_gpus({g: 1 - g // 4 for g in range(8)}))
    warning = next(p for p in report.problems if p.field == "prefill.numa_node")
    assert "sit on NUMA node(s) [1], not 0" in warning.message


def test_unknown_gpu_affinity_is_a_skip_not_a_pass(reference, real_tools):
    report = check_host(reference, real_tools, eight_gpus({g: None for g in range(8)}))
    assert not any(p.field.endswith("numa_node") for p in report.problems)
    assert sum("GPU NUMA affinity unknown" in reason for reason in report.skipped) == 2


def test_no_nvidia_smi_is_a_stated_skip(reference, real_tools):
    report = check_host(reference, real_tools, HostView(None, [0, 1], {}))
    assert "GPU count and GPU NUMA affinity: nvidia-smi is not available here" in report.skipped


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
