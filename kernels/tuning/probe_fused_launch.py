#!/usr/bin/env python3
"""Tuning aid: split vs fused (cooperative launch) vs fused (plain launch, same resident grid), round-robin,
same Timer as bench_dsa_indexer.py. Not the benchmark."""
# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from harness import Timer, fixed_generator, indexer_pool, indexer_requests, random_pages

from pdserve_kernels.dsa_indexer import DsaIndexer

gen, timer, ind = fixed_generator(1), Timer(), DsaIndexer()
kv = indexer_pool(8 * 131072 // 64, gen)
for B, L in [(1, 8192), (1, 32768), (1, 131072), (1, 524288), (8, 131072)]:
    q, w, ctx, bt = indexer_requests(B, L, gen, random_pages(kv.shape[0], B, L, gen))
    fns = [lambda: ind(q, w, kv, ctx, bt, 2048, max_len=L, path="split"),
           lambda: ind(q, w, kv, ctx, bt, 2048, max_len=L, path="fused"),
           lambda: ind(q, w, kv, ctx, bt, 2048, max_len=L, path="fused", _cooperative=False),
           lambda: ind(q, w, kv, ctx, bt, 2048, max_len=L, path="split", _select=False)]
    t = timer.medians_us(fns, 50)
    print(json.dumps({"B": B, "L": L, "split": round(t[0], 1), "fused_coop": round(t[1], 1),
                      "fused_plain": round(t[2], 1), "score_only": round(t[3], 1),
                      "fused_chunk": ind.fused_chunk_pages(B, L, 1, "wgmma")}), flush=True)
