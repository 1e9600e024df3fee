"""The shared-GPU rule, once for every layout: the servers on one host use disjoint GPU sets, unless
allow_shared_gpus permits sharing; then the memory fractions of two servers on one GPU must leave room for
both. A single-host file is a one-host deployment: its prefill and decode are the servers of its one host.
"""

from __future__ import annotations

from collections.abc import Iterator

from pdserve.schema.config import Deployment
from pdserve.schema.problems import Problem, Severity
from pdserve.schema.topology import IMPLIED_HOST, Server, servers

# Prefill and decode on one GPU (allow_shared_gpus) each size their static pool (weights + KV) as a fraction
# of the memory free when they start; the units start the decode after the prefill, but a hand-started
# pair may measure before either allocates, so the limit holds for the plain sum. The rest of the GPU
# must then hold both processes' CUDA contexts, CUDA graphs and activations. SGLang keeps 10 GiB or more
# outside the pool for one server on a large GPU (server_args' reserved_mem); 0.1 of an H200 is 14 GiB.
SHARED_GPU_FRACTION_LIMIT = 0.9


def _on_host(dep: Deployment) -> dict[str, list[Server]]:
    """The PD servers each host runs a node of, in server order."""
    placed: dict[str, list[Server]] = {}
    for server in servers(dep):
        for host in server.hosts:
            placed.setdefault(host, []).append(server)
    return placed


def _refused(host: str, server: Server, earlier: Server, shared: list[int]) -> Problem:
    where = f" of host {host}" if host != IMPLIED_HOST else ""
    fix = (f"give the servers on host {host} disjoint GPU sets" if host != IMPLIED_HOST else
           "give prefill and decode disjoint GPU sets, e.g. prefill [0,1,2,3] and decode [4,5,6,7]")
    return Problem(f"{server.field}.gpus", server.spec.gpus,
                   f"shares GPU(s) {shared}{where} with {earlier.field}.gpus {earlier.spec.gpus}",
                   f"{fix} (on a small test rig: set allow_shared_gpus = true, with memory fractions adding up to "
                   f"at most {SHARED_GPU_FRACTION_LIMIT:g})")


def _too_large(host: str, server: Server, earlier: Server, shared: list[int]) -> Problem | None:
    mine, theirs = server.spec.mem_fraction_static, earlier.spec.mem_fraction_static
    total = mine + theirs
    if total <= SHARED_GPU_FRACTION_LIMIT + 1e-9:
        return None
    where = f" of host {host}" if host != IMPLIED_HOST else ""
    half = int(SHARED_GPU_FRACTION_LIMIT * 100 / 2) / 100
    return Problem(f"{server.field}.mem_fraction_static", mine,
                   f"with {earlier.field}.mem_fraction_static {theirs:g} on the same GPU(s) {shared}{where} the two "
                   f"servers' static pools take {total:g} of its memory, leaving too little for their CUDA graphs "
                   "and activations",
                   f"lower {earlier.field}.mem_fraction_static and {server.field}.mem_fraction_static so that they "
                   f"add up to at most {SHARED_GPU_FRACTION_LIMIT:g}, e.g. {half:g} each")


def disjoint_gpus(dep: Deployment) -> Iterator[Problem]:
    shared_any = False
    for host, placed in _on_host(dep).items():
        for index, server in enumerate(placed):
            for earlier in placed[:index]:
                shared = sorted(set(server.spec.gpus) & set(earlier.spec.gpus))
                if not shared:
                    continue
                shared_any = True
                problem = (_refused(host, server, earlier, shared) if not dep.allow_shared_gpus else
                           _too_large(host, server, earlier, shared))
                if problem is not None:
                    yield problem
    if dep.allow_shared_gpus and not shared_any and len(servers(dep)) > 1:
        yield Problem("allow_shared_gpus", True, f"is set but {_no_sharing(dep)} share no GPU",
                      "remove allow_shared_gpus (it only permits sharing; disjoint GPUs need no flag)",
                      Severity.WARNING)


def _no_sharing(dep: Deployment) -> str:
    found = servers(dep)
    if len(found) == 2 and all(s.hosts == (IMPLIED_HOST,) for s in found):
        return " and ".join(f"{s.field}.gpus {s.spec.gpus}" for s in found)
    return "the servers of each host"
