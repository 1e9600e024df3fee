#!/usr/bin/env python3
"""Tuning aid (not the benchmark): is a sparse-MLA timing the kernel, the host or the memory system?
For a few shapes and kernels it prints (1) the launcher's host time per call, (2) the Timer's median with the
usual 200K-cycle head start and with a 4M-cycle one (host launch cost hidden either way only if it is shorter
than the head start), (3) the median over KV pools of 2^16 .. 2^22 entries (TLB / DRAM-page sensitivity of the
random gather). `--ncu`: one launch of one shape, for ncu."""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parent / "bench"))

import torch  # noqa: E402
from harness import CASES, PAGE, Timer, distinct_indices, random_pool  # noqa: E402

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode  # noqa: E402
from pdserve_kernels.sparse_mla_reference import LAYOUTS  # noqa: E402

SHAPES = [("v32", 64, 128, "wg"), ("v32", 64, 128, "auto"), ("v32", 64, 16, "auto"), ("v4-csa", 64, 16, "auto"),
          ("v4-csa", 64, 64, "wg"), ("v4-csa", 64, 64, "auto"), ("v32", 1, 128, "auto"), ("v4-csa", 1, 16, "auto")]


def make_call(mla, case, B, h, variant, pool_entries, gen):
    layout, k_main, k_win = CASES[case]
    lay = LAYOUTS[layout]
    _, kv = random_pool(lay, pool_entries, gen)
    ind = distinct_indices(B, k_main, kv.shape[0] * PAGE, gen).view(B, 1, k_main)
    extra = {}
    if k_win:
        _, win = random_pool(lay, 1 << 17, gen)
        extra = {"extra_kv": win,
                 "extra_indices": distinct_indices(B, k_win, win.shape[0] * PAGE, gen).view(B, 1, k_win)}
    q = torch.randn((B, 1, h, lay.dqk), device="cuda", generator=gen).to(torch.bfloat16)
    sinks = torch.randn((h,), device="cuda", generator=gen)
    pick = {"kernel": variant} if variant.startswith("sparse_mla_") else {"variant": variant}
    pick["lossy_bf16_dequant"] = True   # a named kernel or family, V3.2's may round e4m3 x scale (exact on pow2)
    return lambda: mla(q, kv, ind, lay.dqk ** -0.5, layout=layout, sinks=sinks, **pick, **extra)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ncu", default=None, help="case,B,h,variant (or a kernel name): one launch only")
    ap.add_argument("--shapes", default=None, help="case:B:h:variant,... instead of the built-in list")
    ap.add_argument("--no-pools", action="store_true", help="skip the KV-pool size sweep")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    mla = SparseMlaDecode()
    if args.ncu:
        case, B, h, variant = args.ncu.split(",")
        fn = make_call(mla, case, int(B), int(h), variant, 1 << 20, gen)
        fn()   # warm-up launch (profile the second: --launch-skip 1)
        fn()
        torch.cuda.synchronize()
        return 0
    short, long_ = Timer(head_start_cycles=200_000), Timer(head_start_cycles=4_000_000)
    print("| case | B | h | variant | host us/call | median us (200K head start) | median us (4M) | "
          "median us by pool 2^16 / 2^18 / 2^20 / 2^22 entries |")
    print("|---|---|---|---|---|---|---|---|")
    shapes = SHAPES if not args.shapes else [
        (c, int(b), int(h), "" if v == "first" else v) for c, b, h, v in (x.split(":") for x in args.shapes.split(","))]
    for case, B, h, variant in shapes:
        fn = make_call(mla, case, B, h, variant, 1 << 20, gen)
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
        a = short.median_us(fn, args.reps)
        b = long_.median_us(fn, args.reps)
        pools = []
        for e in () if args.no_pools else (16, 18, 20, 22):
            f2 = make_call(mla, case, B, h, variant, 1 << e, gen)
            pools.append(short.median_us(f2, args.reps))
            del f2
            torch.cuda.empty_cache()
        print(f"| {case} | {B} | {h} | {variant} | {host:.1f} | {a:.1f} | {b:.1f} | "
              + " / ".join(f"{x:.1f}" for x in pools) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
