"""Timing smoke of the serving ops (pdserve_kernels.ops) against the launchers, same kernels, one table:
host time to queue one call (the GPU is held busy meanwhile, so this is the enqueue cost alone), and device
time per call for back-to-back eager calls of the launcher and of the op, and for replays of a CUDA graph of
the same calls (no launch gaps). Not L2-flushed: this measures call overhead, not the kernels
(bench_dsa_indexer.py / bench_sparse_mla.py do that).

    python3 kernels/bench/bench_ops.py [--calls 20] [--reps 10] [--json FILE]
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import statistics
import time

import torch
from harness import finish, row_table, run_env, seeded_generator

from pdserve_kernels import ops
from pdserve_kernels.reference import make_inputs as dsa_inputs
from pdserve_kernels.sparse_mla_reference import make_inputs as mla_inputs


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)   # keep the GPU busy so the queue never drains while we enqueue
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return t


def device_us(fn, calls: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def graph_us(fn, calls: int, reps: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    return device_us(g.replay, 1, reps) / calls


def cases(gen):
    for B, L in ((1, 131072), (64, 32768)):
        inp = dsa_inputs(B, 1, [L] * B, generator=gen)
        plan = ops.DsaIndexerPlan(B, 1, 2048, L)
        ind = ops.indexer_for()
        yield (f"indexer B={B} L={L}", lambda inp=inp: ind(**inp, topk=2048, max_len=L),
               lambda inp=inp, plan=plan: plan(**inp))
    # Under CUDA graphs the plan's max_len is the captured bound, not the batch's longest request: short rows
    # under a 160K bound (the grids are sized from the bound; CTAs past a row's length exit early).
    for B, L, bound in ((1, 4096, 4096), (1, 4096, 163840), (32, 4096, 4096), (32, 4096, 163840)):
        inp = dsa_inputs(B, 1, [L] * B, generator=gen, max_blocks=bound // 64)
        plan = ops.DsaIndexerPlan(B, 1, 2048, bound)
        ind = ops.indexer_for()
        yield (f"indexer B={B} L={L} max_len={bound}",
               lambda inp=inp, bound=bound: ind(**inp, topk=2048, max_len=bound),
               lambda inp=inp, plan=plan: plan(**inp))
    for layout, h, B in (("v32", 128, 64), ("v32", 16, 64), ("v32", 128, 1), ("v32_bf16", 128, 64)):
        m = mla_inputs(layout, B, 1, h, 2048, generator=gen)
        plan = ops.SparseMlaPlan(layout, B, 1, h, 2048)
        mla = ops.mla_for()
        yield (f"sparse MLA {layout} h={h} B={B} ({plan.plan.kernel}, {plan.plan.splits} splits)",
               lambda m=m, k=plan.plan.kernel: mla(m["q"], m["kv"], m["indices"], 0.1352, layout=layout.split("_")[0],
                                                   sinks=m["sinks"], kernel=k),
               lambda m=m, plan=plan: plan(m["q"], m["kv"], m["indices"], 0.1352, sinks=m["sinks"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    env = run_env()
    rows = []
    for name, launcher, op in cases(seeded_generator()):
        launcher(), op()
        rows.append({"case": name, "host_launcher": host_us(launcher, args.calls), "host_op": host_us(op, args.calls),
                     "dev_launcher": device_us(launcher, args.calls, args.reps),
                     "dev_op": device_us(op, args.calls, args.reps), "dev_graph": graph_us(op, args.calls, args.reps)})

    head = "| case | host us/call launcher | host us/call op | device us/call launcher | op | op in a CUDA graph |"
    row = "| {case} | {host_launcher:.1f} | {host_op:.1f} | {dev_launcher:.1f} | {dev_op:.1f} | {dev_graph:.1f} |"
    table = row_table(f" | {args.calls} calls x {args.reps} reps", head, row)
    return finish(env, rows, args.json, table)


if __name__ == "__main__":
    raise SystemExit(main())
