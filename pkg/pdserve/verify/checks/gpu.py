"""GPU memory per GPU against each role's mem-fraction-static, and who runs on which GPU (NVML)."""

from __future__ import annotations

from collections.abc import Mapping

from pdserve.probes.observations import GpuObs
from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed, warned

GIB = 2**30
# mem_fraction_static covers weights + KV pool; activations, CUDA graphs and NCCL buffers come on top.
BELOW = 0.10  # used/total this far under the fraction: the server is not (fully) on this GPU
ABOVE = 0.12  # this far over it: close to out-of-memory under load
IDLE = 0.05  # a GPU outside every role may hold the driver's reservation, not a model


def _owners(exp: Expectations) -> dict[int, tuple[str, ...]]:
    """GPU -> the roles placed on it: one role, or prefill and decode together under allow_shared_gpus."""
    owners: dict[int, tuple[str, ...]] = {}
    for role, w in exp.workers.items():
        for gpu in w.gpus:
            owners[gpu] = (*owners.get(gpu, ()), role)
    return owners


def _expected_share(exp: Expectations, roles: tuple[str, ...]) -> float:
    """The part of a GPU its roles hold. SGLang sizes a server's static pool as its fraction of the memory
    free when it starts, and on a shared GPU the decode starts after the prefill (its unit is After= it):
    p + d * (1 - p). The one-H200 GPU tier measured it: the decode's pool 11% smaller at 0.1 each."""
    held = 0.0
    for role in roles:
        held += exp.workers[role].mem_fraction_static * (1 - held)
    return held


def _named(roles: tuple[str, ...]) -> str:
    return " + ".join(roles)


def _line(g: GpuObs, roles: tuple[str, ...] | None) -> str:
    ratio = g.memory_used / g.memory_total if g.memory_total else 0.0
    who = _named(roles) if roles else "no role"
    return f"GPU {g.index} ({g.name}): {g.memory_used / GIB:.1f}/{g.memory_total / GIB:.1f} GiB ({ratio:.2f}), {who}"


def check_memory(exp: Expectations, gpus: list[GpuObs]) -> CheckResult:
    cid = "gpu.memory"
    owners = _owners(exp)
    expected = "; ".join(
        f"{role} GPUs {','.join(map(str, w.gpus))} at {w.mem_fraction_static:g} "
        f"(-{BELOW:g}/+{ABOVE:g}) of total" for role, w in exp.workers.items()
    ) + f"; other GPUs below {IDLE:g} used"
    by_index = {g.index: g for g in gpus}
    problems, warnings, lines = [], [], []
    for gpu in sorted(owners.keys() - by_index.keys()):
        problems.append(f"GPU {gpu} ({_named(owners[gpu])}) is not present on this host (NVML sees {len(gpus)} GPUs)")
    for g in gpus:
        roles = owners.get(g.index)
        lines.append(_line(g, roles))
        ratio = g.memory_used / g.memory_total if g.memory_total else 0.0
        if roles is None:
            if ratio > IDLE:
                problems.append(f"GPU {g.index} belongs to no role but {ratio:.2f} of it is used")
            continue
        fraction = _expected_share(exp, roles)
        role = _named(roles)
        if ratio < fraction - BELOW:
            problems.append(f"GPU {g.index} ({role}) uses {ratio:.2f}, expected about {fraction:.2f}")
        elif ratio > min(0.995, fraction + ABOVE):
            warnings.append(f"GPU {g.index} ({role}) uses {ratio:.2f}, well above mem_fraction_static {fraction:g}")
    observed = "; ".join(lines) or "NVML reports no GPUs"
    if problems:
        return failed(cid, observed, expected,
                      "a role's GPU barely used means its server is down or on other GPUs (check "
                      "CUDA_DEVICE_ORDER=PCI_BUS_ID and --base-gpu-id); memory on a GPU outside every role means "
                      "a stray process: find it with `nvidia-smi` and stop it", problems + warnings)
    if warnings:
        return warned(cid, observed, expected,
                      "lower mem_fraction_static or the CUDA graph batch sizes to keep headroom", warnings)
    return passed(cid, observed, expected, lines)


def trace_owners(exp: Expectations, gpus: list[GpuObs], units: Mapping[int, str | None],
                 commands: Mapping[int, str], trees: Mapping[str, set[int]]) -> dict[int, tuple[str | None, str]]:
    """pid -> (role or None, description) for every process on a GPU. A process in a systemd unit belongs
    to the role of that unit ("other" for any other unit); one in no unit (no systemd, or started by
    hand) to the role whose process tree holds it; None when neither says.

    units: pid -> its unit (pdserve.probes.cgroups.unit_of); commands: pid -> its command line ("" when
    gone); trees: role -> the pids of its process tree."""
    unit_roles = {f"{w.unit}.service": role for role, w in exp.workers.items()}
    owner_of: dict[int, tuple[str | None, str]] = {}
    for pid in sorted({p for g in gpus for p in g.pids}):
        unit, command = units.get(pid), commands.get(pid, "")[:60]
        if unit in unit_roles:
            owner_of[pid] = (unit_roles[unit], unit)
        elif unit is not None:
            owner_of[pid] = ("other", f"unit {unit} ({command})")
        else:
            role = next((r for r, tree in trees.items() if pid in tree), None)
            owner_of[pid] = (role, f"{role} process tree" if role else command or "not in /proc")
    return owner_of


def check_processes(exp: Expectations, gpus: list[GpuObs], owner_of: dict[int, tuple[str | None, str]]) -> CheckResult:
    """owner_of: pid -> (role whose unit/process tree holds it, or None; description for the report)."""
    cid = "gpu.processes"
    owners = _owners(exp)
    expected = "; ".join(f"GPUs {','.join(map(str, w.gpus))}: only processes of {w.unit}"
                         for w in exp.workers.values()) + "; other GPUs: none"
    problems, warnings, lines = [], [], []
    for g in gpus:
        roles = owners.get(g.index)
        described = [f"{pid} {owner_of.get(pid, (None, 'unknown'))[1]}" for pid in g.pids]
        lines.append(f"GPU {g.index}: " + (", ".join(described) or "no processes"))
        if roles is None:
            if g.pids:
                problems.append(f"GPU {g.index} belongs to no role but runs {', '.join(described)}")
            continue
        traced = {owner_of.get(pid, (None, ""))[0] for pid in g.pids}
        untraced = None in traced
        for role in roles:
            # A process that cannot be traced may be this role's: that is a warning below, not a missing server.
            if role not in traced and not untraced:
                problems.append(
                    f"GPU {g.index} ({role}) runs no {role} process; {exp.workers[role].unit} should hold it")
        for pid in g.pids:
            got, desc = owner_of.get(pid, (None, "unknown"))
            if got is None:
                warnings.append(f"GPU {g.index}: pid {pid} ({desc}) could not be traced to a unit")
            elif got not in roles:
                problems.append(f"GPU {g.index} belongs to {_named(roles)} but pid {pid} is {desc}")
    observed = "; ".join(lines)
    if problems:
        return failed(cid, observed, expected,
                      "a role's server runs on another role's GPUs (check gpus/--base-gpu-id and "
                      "CUDA_DEVICE_ORDER=PCI_BUS_ID) or a stray process holds a GPU: stop it", problems + warnings)
    if warnings:
        return warned(cid, observed, expected,
                      "run the verifier as root (or in the host's PID namespace) so every GPU process can be traced",
                      warnings)
    return passed(cid, observed, expected)
