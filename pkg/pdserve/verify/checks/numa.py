"""Each role's processes bound to the CPUs and memory of its configured NUMA node."""

from __future__ import annotations

from pdserve.probes.cpulist import parse_list, ranges  # noqa: F401 (parse_list: re-exported)
from pdserve.probes.observations import ProcNuma
from pdserve.verify.expect import WorkerExpectation
from pdserve.verify.result import CheckResult, failed, passed, skipped, warned

LOCAL_SHARE = 0.90  # of a process's resident pages on its node; a few shared-library pages live elsewhere


def check_numa(w: WorkerExpectation, node_cpus: frozenset[int] | None, procs: list[ProcNuma]) -> CheckResult:
    cid = f"numa.{w.id}"
    if w.numa_node is None:
        return skipped(cid, f"{w.field}.numa_node is not set, so no binding is expected")
    if node_cpus is None:
        return skipped(cid, f"NUMA node {w.numa_node} is unknown on this host (no "
                            f"/sys/devices/system/node/node{w.numa_node})")
    expected = f"CPUs within node {w.numa_node} ({ranges(node_cpus)}), memory on node {w.numa_node}"
    if not procs:
        return failed(cid, f"no processes found for {w.unit}", expected,
                      f"the {w.role} server is not running: `systemctl status {w.unit}`")
    problems, warnings, lines = [], [], []
    for p in procs:
        cpus = ranges(p.cpus_allowed) if p.cpus_allowed is not None else "?"
        mems = ranges(p.mems_allowed) if p.mems_allowed is not None else "?"
        share = None
        if p.pages_by_node:
            total = sum(p.pages_by_node.values())
            share = p.pages_by_node.get(w.numa_node, 0) / total if total else None
        lines.append(f"pid {p.pid} ({p.command}): cpus {cpus}, mems {mems}"
                     + (f", {share:.0%} of pages on node {w.numa_node}" if share is not None else ""))
        if p.cpus_allowed is not None and not p.cpus_allowed <= node_cpus:
            problems.append(
                f"pid {p.pid} may run on CPUs {ranges(p.cpus_allowed - node_cpus)} outside node {w.numa_node}")
        if p.mems_allowed is not None and w.numa_node not in p.mems_allowed:
            problems.append(f"pid {p.pid} may not allocate on node {w.numa_node} (Mems_allowed {mems})")
        if share is not None and share < LOCAL_SHARE:
            problems.append(f"pid {p.pid} has only {share:.0%} of its pages on node {w.numa_node}")
        if p.pages_by_node is None:
            warnings.append(f"pid {p.pid}: /proc/{p.pid}/numa_maps unreadable; memory placement not checked")
    observed = "; ".join(lines)
    if problems:
        return failed(cid, observed, expected,
                      f"start the {w.role} server under `numactl --cpunodebind={w.numa_node} "
                      f"--membind={w.numa_node}` (pdserve's rendered unit does): re-render and "
                      f"`systemctl restart {w.unit}`", problems + warnings)
    if warnings:
        return warned(cid, observed, expected, "run the verifier as root to read every process's numa_maps", warnings)
    return passed(cid, observed, expected)
