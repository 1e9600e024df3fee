#!/usr/bin/env python3
"""Tuning aid (not the benchmark): time vs chunk_pages, and the scoring pass alone, on a few shapes."""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import torch
from harness import Timer, fixed_generator, indexer_pool, indexer_requests, random_pages

from pdserve_kernels.dsa_indexer import DsaIndexer

gen, timer, ind = fixed_generator(1), Timer(), DsaIndexer()
shapes = [(1, 8192), (1, 131072), (1, 524288), (8, 32768), (64, 32768), (128, 131072)]
pool_blocks = max(b * n for b, n in shapes) // 64
kv = indexer_pool(pool_blocks, gen)
tiny = torch.ones(1, device="cuda")
print(f"calibration: one tiny torch kernel between events: {timer.median_us(lambda: tiny.add_(1), 30):.1f} us")
impls = sys.argv[1].split(",") if len(sys.argv) > 1 else ["wgmma"]
for impl in impls:
    for B, L in shapes:
        q, w, ctx, used = indexer_requests(B, L, gen, random_pages(pool_blocks, B, L, gen))
        floor = B * L * 132 / 4.25e12 * 1e6
        default = ind.default_chunk_pages(B, L, 1)
        res = []
        for cp in (4, 8, 16, 32, 64):
            t = timer.median_us(lambda: ind(q, w, kv, ctx, used, 2048, max_len=L, chunk_pages=cp, impl=impl), 30)
            ts = timer.median_us(lambda: ind(q, w, kv, ctx, used, 2048, max_len=L, chunk_pages=cp, impl=impl,
                                             _select=False), 30)
            res.append(f"{cp}:{t:.1f}/{ts:.1f}")
        t0, t1 = timer.medians_us([lambda: ind(q, w, kv, ctx, used, 2048, max_len=L, impl=impl, pdl=False),
                                   lambda: ind(q, w, kv, ctx, used, 2048, max_len=L, impl=impl, pdl=True)], 30)
        res.append(f"pdl off/on: {t0:.1f}/{t1:.1f}")
        print(f"{impl} B={B} L={L} floor~{floor:.1f}us default_cp={default} total/score-only us: " + " ".join(res),
              flush=True)
