"""What `pdserve check` can see of the host it runs on: GPUs, NUMA nodes, executables, files.

Every check either finds problems, passes, or is skipped with the reason it could not run; an
unknown answer (no nvidia-smi, a GPU whose NUMA node the kernel reports as -1) is a skip, not a pass.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import Deployment, ServerSpec
from pdserve.schema.problems import Problem, Severity

NVIDIA_SMI_TIMEOUT_SEC = 15.0


@dataclass
class HostReport:
    problems: list[Problem] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HostView:
    """Facts read off the host; tests build one by hand."""

    gpu_bus_ids: list[str] | None  # index -> PCI bus id; None when unknown
    numa_nodes: list[int] | None
    gpu_numa: dict[int, int | None]  # GPU index -> NUMA node, None when the kernel does not say


def _servers(dep: Deployment) -> list[tuple[str, ServerSpec]]:
    return [("prefill", dep.prefill), ("decode", dep.decode), ("fallback", dep.fallback)]


def read_host(sys_root: Path = Path("/sys")) -> HostView:
    bus_ids = _gpu_bus_ids()
    nodes_dir = sys_root / "devices/system/node"
    numa_nodes = None
    if nodes_dir.is_dir():
        numa_nodes = sorted(int(m.group(1)) for p in nodes_dir.iterdir() if (m := re.fullmatch(r"node(\d+)", p.name)))
    gpu_numa: dict[int, int | None] = {}
    for index, bus_id in enumerate(bus_ids or []):
        # nvidia-smi prints 00000000:3B:00.0; sysfs names it 0000:3b:00.0.
        domain, rest = bus_id.split(":", 1)
        node_file = sys_root / "bus/pci/devices" / f"{domain[-4:]}:{rest}".lower() / "numa_node"
        try:
            node = int(node_file.read_text().strip())
        except (OSError, ValueError):
            node = -1
        gpu_numa[index] = node if node >= 0 else None
    return HostView(bus_ids, numa_nodes, gpu_numa)


def _gpu_bus_ids() -> list[str] | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_SEC, check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    rows = [line.split(",") for line in done.stdout.strip().splitlines() if line.strip()]
    return [bus.strip() for _, bus in sorted((int(i), b) for i, b in rows)]


def check_gpus(dep: Deployment, host: HostView, report: HostReport) -> None:
    if host.gpu_bus_ids is None:
        report.skipped.append("GPU count and GPU NUMA affinity: nvidia-smi is not available here")
        return
    count = len(host.gpu_bus_ids)
    for role, server in _servers(dep):
        missing = [g for g in server.gpus if g >= count]
        if missing:
            report.problems.append(Problem(f"{role}.gpus", server.gpus, f"GPU(s) {missing} do not exist: this host has {count}",
                                           f"use GPU indices 0-{count - 1}"))
    report.passed.append(f"GPU indices exist ({count} GPUs)")
    for role, server in _servers(dep):
        if server.numa_node is None:
            continue
        known = {g: host.gpu_numa.get(g) for g in server.gpus if g < count}
        if any(node is None for node in known.values()):
            report.skipped.append(f"{role}: GPU NUMA affinity unknown (the kernel reports -1 for some of {server.gpus})")
            continue
        far = sorted(g for g, node in known.items() if node != server.numa_node)
        if far:
            report.problems.append(Problem(
                f"{role}.numa_node", server.numa_node,
                f"GPU(s) {far} sit on NUMA node(s) {sorted({known[g] for g in far})}, not {server.numa_node}",
                "bind the role to its GPUs' NUMA node, or pick GPUs on that node",
                Severity.WARNING,
            ))


def check_numa_nodes(dep: Deployment, host: HostView, report: HostReport) -> None:
    if host.numa_nodes is None:
        report.skipped.append("NUMA nodes: /sys/devices/system/node is not readable here")
        return
    for role, server in _servers(dep):
        if server.numa_node is not None and server.numa_node not in host.numa_nodes:
            report.problems.append(Problem(f"{role}.numa_node", server.numa_node,
                                           f"this host has NUMA nodes {host.numa_nodes}",
                                           f"use one of {host.numa_nodes}, or unset it to skip binding"))
    report.passed.append(f"NUMA nodes exist ({host.numa_nodes})")


def check_files(dep: Deployment, tools: Toolchain, report: HostReport) -> None:
    needed = ["sglang_python", "pdserve"]
    if any(server.numa_node is not None for _, server in _servers(dep)):
        needed.append("numactl")
    missing = [name for name in needed
               if not (os.path.isfile(getattr(tools, name)) and os.access(getattr(tools, name), os.X_OK))]
    for name in missing:
        report.problems.append(Problem(f"tools.{name}", getattr(tools, name), "is not an executable file on this host",
                                       f"install it or point tools.{name} at the right path"))
    if not missing:
        report.passed.append(f"tool executables exist ({', '.join(needed)})")
    model = dep.model.path
    if model.startswith("/"):
        if not Path(model).is_dir():
            report.problems.append(Problem("model.path", model, "no such directory on this host",
                                           "download the model there or correct the path", Severity.WARNING))
    else:
        report.skipped.append(f"model.path: {model} is a hub id, resolved by SGLang at launch")
    key = dep.router.api_key_file
    if key is not None:
        try:
            mode = Path(key).stat().st_mode
        except OSError:
            report.problems.append(Problem("router.api_key_file", key, "does not exist on this host",
                                           "create it with the key as its only content, mode 0600"))
        else:
            if mode & 0o077:
                report.problems.append(Problem("router.api_key_file", key, f"is readable by others (mode {oct(mode & 0o777)})",
                                               f"chmod 600 {key}", Severity.WARNING))


def check_host(dep: Deployment, tools: Toolchain, host: HostView | None = None) -> HostReport:
    report = HostReport()
    host = host or read_host()
    check_gpus(dep, host, report)
    check_numa_nodes(dep, host, report)
    check_files(dep, tools, report)
    return report
