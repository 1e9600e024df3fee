"""What `pdserve check` can see of the host it runs on: GPUs, NUMA nodes, executables, files.

Every check either finds problems, passes, or is skipped with the reason it could not run; an
unknown answer (no NVML, a GPU whose NUMA node the kernel reports as -1) is a skip, not a pass.
The host is read through pdserve.probes (NVML for the GPUs, as the verifier reads them; sysfs for NUMA;
probes.paths for the tools, the model directory and the key file; pdserve.check.access for what the
units' user may do with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pdserve.check.access import check_access
from pdserve.probes import nvml, paths, topology
from pdserve.probes.observations import Unavailable
from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import Deployment, ServerSpec
from pdserve.schema.placement import place
from pdserve.schema.problems import Problem, Severity


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
    gpus_unknown: str = "NVML is not available here"  # why gpu_bus_ids is None


def _servers(dep: Deployment) -> list[tuple[str, ServerSpec]]:
    return [(p.role, p.spec) for p in place(dep).placed if p.spec is not None]


def read_host(sys_root: Path = topology.SYS, read_gpus=nvml.read_gpus) -> HostView:
    nodes = topology.numa_nodes(sys_root)
    try:
        gpus = sorted(read_gpus(), key=lambda g: g.index)
    except Unavailable as exc:
        return HostView(None, nodes, {}, str(exc))
    return HostView([g.pci_bus_id for g in gpus], nodes,
                    {g.index: topology.pci_numa_node(g.pci_bus_id, sys_root) for g in gpus})


def check_gpus(dep: Deployment, host: HostView, report: HostReport) -> None:
    if host.gpu_bus_ids is None:
        report.skipped.append(f"GPU count and GPU NUMA affinity: {host.gpus_unknown}")
        return
    count = len(host.gpu_bus_ids)
    for role, server in _servers(dep):
        missing = [g for g in server.gpus if g >= count]
        if missing:
            report.problems.append(Problem(f"{role}.gpus", server.gpus,
                                           f"GPU(s) {missing} do not exist: this host has {count}",
                                           f"use GPU indices 0-{count - 1}"))
    report.passed.append(f"GPU indices exist ({count} GPUs)")
    for role, server in _servers(dep):
        if server.numa_node is None:
            continue
        known = {g: host.gpu_numa.get(g) for g in server.gpus if g < count}
        if any(node is None for node in known.values()):
            report.skipped.append(
                f"{role}: GPU NUMA affinity unknown (the kernel reports -1 for some of {server.gpus})")
            continue
        far = {g: node for g, node in known.items() if node is not None and node != server.numa_node}
        if far:
            report.problems.append(Problem(
                f"{role}.numa_node", server.numa_node,
                f"GPU(s) {sorted(far)} sit on NUMA node(s) {sorted(set(far.values()))}, not {server.numa_node}",
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


NOT_EXECUTABLE = "is not an executable file on this host"


def check_files(dep: Deployment, tools: Toolchain, report: HostReport) -> None:
    needed = ["sglang_python", "pdserve"]
    if any(server.numa_node is not None for _, server in _servers(dep)):
        needed.append("numactl")
    missing = [name for name in needed if not paths.is_executable_file(getattr(tools, name))]
    for name in missing:
        report.problems.append(Problem(f"tools.{name}", getattr(tools, name), NOT_EXECUTABLE,
                                       f"install it or point tools.{name} at the right path"))
    if not missing:
        report.passed.append(f"tool executables exist ({', '.join(needed)})")
    model = dep.model.path
    if model.startswith("/"):
        if not paths.is_directory(model):
            report.problems.append(Problem("model.path", model, "no such directory on this host",
                                           "download the model there or correct the path", Severity.WARNING))
    else:
        report.skipped.append(f"model.path: {model} is a hub id, resolved by SGLang at launch")
    key = dep.router.api_key_file
    if key is not None:
        mode = paths.file_mode(key)
        if mode is None:
            report.problems.append(Problem("router.api_key_file", key, "does not exist on this host",
                                           "create it with the key as its only content, mode 0600"))
        elif mode & 0o077:
            report.problems.append(Problem("router.api_key_file", key,
                                           f"is readable by others (mode {oct(mode & 0o777)})",
                                           f"chmod 600 {key}", Severity.WARNING))


def check_host(dep: Deployment, tools: Toolchain, host: HostView | None = None) -> HostReport:
    report = HostReport()
    host = host or read_host()
    check_gpus(dep, host, report)
    check_numa_nodes(dep, host, report)
    check_files(dep, tools, report)
    check_access(dep, tools, report.problems, report.passed, report.skipped)
    return report
