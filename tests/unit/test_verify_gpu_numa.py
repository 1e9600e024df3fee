"""GPU memory/processes and NUMA binding, judged on recorded NVML and /proc observations."""

from pdserve.probes.observations import GpuObs, ProcNuma
from pdserve.schema.loading import load
from pdserve.verify.checks import gpu, numa
from pdserve.verify.expect import expectations

EXP = expectations(load().deployment)  # prefill GPUs 0-3 at 0.80, decode 4-7 at 0.85
GIB = 2**30
TOTAL = 140 * GIB


def gpus(used: dict[int, float], pids: dict[int, tuple[int, ...]] | None = None) -> list[GpuObs]:
    pids = pids or {}
    return [GpuObs(i, "NVIDIA H200", int(used.get(i, 0.0) * TOTAL), TOTAL, pids.get(i, ())) for i in range(8)]


HEALTHY = dict.fromkeys(range(8), 0.89)


def test_memory_near_each_fraction_passes():
    result = gpu.check_memory(EXP, gpus(HEALTHY))
    assert result.status == "pass"
    assert "GPU 0 (NVIDIA H200): 124.6/140.0 GiB (0.89), prefill" in result.observed


def test_memory_barely_used_fails_and_names_the_gpu():
    result = gpu.check_memory(EXP, gpus({**HEALTHY, 5: 0.02}))
    assert result.status == "fail" and "GPU 5 (decode) uses 0.02, expected about 0.85" in result.details


def test_memory_outside_every_role_must_be_idle():
    exp = expectations(load().deployment.model_copy(update={
        "decode": load().deployment.decode.model_copy(update={"gpus": [4, 5, 6]})}))
    result = gpu.check_memory(exp, gpus(HEALTHY))
    assert result.status == "fail" and "GPU 7 belongs to no role but 0.89 of it is used" in result.details


def test_memory_far_above_fraction_warns():
    assert gpu.check_memory(EXP, gpus({**HEALTHY, 0: 0.995})).status == "warn"


def test_missing_gpu_fails():
    result = gpu.check_memory(EXP, gpus(HEALTHY)[:6])
    assert result.status == "fail" and any("GPU 7 (decode) is not present on this host" in d for d in result.details)


OWNERS = {100: ("prefill", "sglang-dsv4-prefill"), 200: ("decode", "sglang-dsv4-decode")}


def test_processes_on_their_roles_gpus_pass():
    pids = {i: (100,) if i < 4 else (200,) for i in range(8)}
    assert gpu.check_processes(EXP, gpus(HEALTHY, pids), OWNERS).status == "pass"


def test_decode_process_on_a_prefill_gpu_fails():
    pids = {i: (100,) if i < 4 else (200,) for i in range(8)}
    pids[2] = (100, 200)
    result = gpu.check_processes(EXP, gpus(HEALTHY, pids), OWNERS)
    assert result.status == "fail"
    assert "GPU 2 belongs to prefill but pid 200 is sglang-dsv4-decode" in result.details


def test_untraceable_process_warns():
    pids = {i: (100,) if i < 4 else (200,) for i in range(8)}
    pids[7] = (200, 999)
    result = gpu.check_processes(EXP, gpus(HEALTHY, pids), {**OWNERS, 999: (None, "python stray.py")})
    assert result.status == "warn" and "pid 999 (python stray.py)" in result.details[0]


def test_owners_come_from_the_unit_then_the_role_process_tree():
    """The correlation the verifier runs on what NVML, the cgroups and /proc said (runner code before)."""
    pids = {0: (100, 300), 4: (200,), 5: (400,), 6: (500,)}
    units = {100: "sglang-dsv4-prefill.service", 200: None, 300: "jupyter.service", 400: None, 500: None}
    commands = {100: "python3 -m sglang.launch_server", 300: "python3 -m ipykernel", 400: "python3 stray.py", 500: ""}
    owners = gpu.trace_owners(EXP, gpus(HEALTHY, pids), units, commands, {"prefill": {100}, "decode": {200, 201}})
    assert owners == {
        100: ("prefill", "sglang-dsv4-prefill.service"),
        200: ("decode", "decode process tree"),  # no unit (started by hand): its role's process tree
        300: ("other", "unit jupyter.service (python3 -m ipykernel)"),
        400: (None, "python3 stray.py"),
        500: (None, "not in /proc"),
    }
    result = gpu.check_processes(EXP, gpus(HEALTHY, pids), owners)
    assert result.status == "fail"
    assert "GPU 0 belongs to prefill but pid 300 is unit jupyter.service" in result.details[0]


def _shared_gpu_expectations():
    """A one-GPU rig: prefill and decode both on GPU 0 (allow_shared_gpus), 0.4 each."""
    dep = load().deployment
    return expectations(dep.model_copy(update={
        "allow_shared_gpus": True,
        "prefill": dep.prefill.model_copy(update={"gpus": [0], "numa_node": None, "mem_fraction_static": 0.4}),
        "decode": dep.decode.model_copy(update={"gpus": [0], "numa_node": None, "mem_fraction_static": 0.4}),
    }))


def one_gpu(used: float, pids: tuple[int, ...]) -> list[GpuObs]:
    return [GpuObs(0, "NVIDIA H200", int(used * TOTAL), TOTAL, pids)]


# Synthetic shapes, modelled on the one measured on an H200 (tests/gpu/README.md: 0.21 of the GPU used with
# 0.1 each): the prefill takes 0.4 of the GPU, the decode 0.4 of what is left, 0.64 in all.
def test_a_shared_gpu_holds_both_fractions_and_both_servers():
    exp = _shared_gpu_expectations()
    memory = gpu.check_memory(exp, one_gpu(0.66, (100, 200)))
    assert memory.status == "pass" and "prefill + decode" in memory.observed
    assert gpu.check_processes(exp, one_gpu(0.66, (100, 200)), OWNERS).status == "pass"


def test_a_shared_gpu_with_one_server_gone_fails_naming_the_missing_role():
    exp = _shared_gpu_expectations()
    memory = gpu.check_memory(exp, one_gpu(0.42, (100,)))
    assert memory.status == "fail" and "GPU 0 (prefill + decode) uses 0.42, expected about 0.64" in memory.details
    processes = gpu.check_processes(exp, one_gpu(0.42, (100,)), OWNERS)
    assert processes.status == "fail"
    assert "GPU 0 (decode) runs no decode process; sglang-dsv4-decode should hold it" in processes.details


def test_kernel_list_format_round_trips():
    assert numa.parse_list("0-3,8-11,15\n") == frozenset({0, 1, 2, 3, 8, 9, 10, 11, 15})
    assert numa.ranges({0, 1, 2, 3, 8, 9, 10, 11, 15}) == "0-3,8-11,15"


NODE1 = numa.parse_list("32-63,96-127")


def proc(pid, cpus="32-63,96-127", mems="0-1", pages=None):
    return ProcNuma(pid, "python3", numa.parse_list(cpus), numa.parse_list(mems),
                    pages if pages is not None else {1: 990, 0: 10})


def test_numa_bound_processes_pass():
    result = numa.check_numa(EXP.workers["decode"], NODE1, [proc(1), proc(2)])
    assert result.status == "pass" and "99% of pages on node 1" in result.observed


def test_numa_cpus_outside_node_fail():
    result = numa.check_numa(EXP.workers["decode"], NODE1, [proc(1, cpus="0-127")])
    assert result.status == "fail" and "pid 1 may run on CPUs 0-31,64-95 outside node 1" in result.details
    assert "numactl --cpunodebind=1 --membind=1" in result.remediation


def test_numa_memory_on_the_other_node_fails():
    result = numa.check_numa(EXP.workers["decode"], NODE1, [proc(1, pages={0: 700, 1: 300})])
    assert result.status == "fail" and "pid 1 has only 30% of its pages on node 1" in result.details


def test_numa_unknown_node_or_unset_skips():
    assert numa.check_numa(EXP.workers["decode"], None, []).status == "skip"
    unset = expectations(load().deployment.model_copy(update={
        "decode": load().deployment.decode.model_copy(update={"numa_node": None})}))
    result = numa.check_numa(unset.workers["decode"], NODE1, [proc(1)])
    assert result.status == "skip" and "numa_node is not set" in result.observed


def test_numa_no_processes_fails():
    assert numa.check_numa(EXP.workers["decode"], NODE1, []).status == "fail"
