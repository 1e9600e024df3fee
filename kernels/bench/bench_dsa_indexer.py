#!/usr/bin/env python3
"""DSA indexer benchmark: one process, one table (kernels/BENCHMARKS.md records its output).

For B in {1, 8, 32, 64, 128}, L in {8K, 32K, 128K, 512K}, max_context in {L, 4L, 1M}, top-k 2048
(plus top-k 512 at max_context = L): median time of our kernel (CUDA events, L2 flushed before every
repeat, >= 30 repeats), GB/s on key bytes (B * L * 132 B), percent of the key-byte floor (those bytes over
the device-to-device copy bandwidth measured at the start of this run), time flatness in max_context,
and the same inputs through the PyTorch reference (logits to max_context + torch.topk, on the shapes
where it is affordable) and DeepGEMM fp8_paged_mqa_logits + mask + torch.topk when `deep_gemm` is importable
(deepgemm_adapter.py).
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch
from deepgemm_adapter import DEEPGEMM_DIST, DeepGemmTopk
from deepgemm_adapter import load as load_deep_gemm
from harness import (
    Timer,
    copy_bandwidth,
    finish,
    floor_us,
    indexer_key_bytes,
    indexer_pool,
    run_env,
    seeded_generator,
    table_head,
)

from pdserve_kernels.dsa_indexer import DsaIndexer
from pdserve_kernels.reference import PAGE, reference_topk_naive

K = 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--lengths", default="8192,32768,131072,524288")
    ap.add_argument("--ref-max-keys", type=int, default=1 << 21,
                    help="time the PyTorch reference only where B * max_context <= this")
    ap.add_argument("--chunk-pages", type=int, default=None)
    ap.add_argument("--impl", default=None)
    ap.add_argument("--json", default=None, help="write every measured row here")
    args = ap.parse_args()
    assert args.reps >= 30, "the benchmark contract is >= 30 repeats"

    Bs = [int(x) for x in args.batches.split(",")]
    Ls = [int(x) for x in args.lengths.split(",")]
    gen = seeded_generator()
    timer = Timer()
    ind = DsaIndexer()
    dg, dg_why = load_deep_gemm()
    env = run_env(deep_gemm=f"{DEEPGEMM_DIST} ({getattr(dg, '__version__', '?')})" if dg else
                  f"not importable ({dg_why})"[:200])
    bw = copy_bandwidth(timer)
    env["copy_GBps"] = round(bw, 1)
    print(json.dumps(env))

    maxB, maxL = max(Bs), max(Ls)
    pool_blocks = maxB * maxL // PAGE
    kv = indexer_pool(pool_blocks, gen)
    q_all = torch.randn((maxB, 1, 64, 128), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w_all = torch.randn((maxB, 64), device="cuda", generator=gen) / 8

    rows = []
    for L in Ls:
        for B in Bs:
            pages = L // PAGE
            used = torch.randperm(pool_blocks, device="cuda", generator=gen)[:B * pages].int().view(B, pages)
            q, w = q_all[:B].contiguous(), w_all[:B].contiguous()
            ctx = torch.full((B,), L, dtype=torch.int32, device="cuda")
            variants = [(2048, mc) for mc in sorted({L, 4 * L, 1 << 20})] + [(512, L)]
            tables = {}
            for _, mc in variants:
                if mc not in tables:
                    bt = torch.zeros((B, mc // PAGE), dtype=torch.int32, device="cuda")
                    bt[:, :pages] = used
                    tables[mc] = bt

            def ours(topk, bt):
                return lambda: ind(q, w, kv, ctx, bt, topk, max_len=L, impl=args.impl, chunk_pages=args.chunk_pages)

            times = timer.medians_us([ours(k, tables[mc]) for k, mc in variants], args.reps)
            base_t = times[0]
            for (topk, mc), t in zip(variants, times, strict=False):
                bt = tables[mc]
                key_bytes = indexer_key_bytes(B, L)
                row = {"B": B, "L": L, "max_context": mc, "topk": topk, "us": t, "GBps": key_bytes / (t * 1e-6) / 1e9,
                       "floor_us": floor_us(key_bytes, 0, bw)}
                row["pct_floor"] = 100 * row["floor_us"] / t
                row["vs_L"] = t / base_t - 1 if topk == 2048 else None
                if mc == L and B * L <= (8 << 20):
                    # Exactness spot check on this shape: our set is the top-k of our own scores.
                    out, sc = ind(q, w, kv, ctx, bt, topk, max_len=L, impl=args.impl, return_scores=True,
                                  chunk_pages=args.chunk_pages)
                    ref_idx = torch.topk(sc[:, :L], topk, dim=1).indices
                    kth = torch.gather(sc[:, :L], 1, ref_idx).min(dim=1).values
                    mine = torch.gather(sc[:, :L], 1, out.long()).min(dim=1).values
                    row["exact"] = bool((mine >= kth).all()) and all(
                        torch.unique(out[r]).numel() == topk for r in range(B))
                if B * mc <= args.ref_max_keys:
                    row["ref_us"] = timer.median_us(lambda: reference_topk_naive(q, w, kv, ctx, bt, topk, mc), 30)
                if dg is not None and topk == 2048:
                    try:
                        dg_call = DeepGemmTopk(dg, q, w, kv, ctx, bt, topk, env["sms"])
                        row["dg_us"] = timer.median_us(dg_call, 30)
                    except Exception as exc:  # noqa: BLE001 - record, keep benchmarking ours
                        row["dg_error"] = repr(exc)[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
            del tables
            del used
    return finish(env, rows, args.json, print_table)


def print_table(env, rows) -> None:
    table_head(env, f" | {env['nvcc']} | copy {env['copy_GBps']} GB/s | DeepGEMM: {env['deep_gemm']}",
               "| B | L | max_context | k | ours us | GB/s | floor us | % of floor | vs max_context=L | exact | "
               "PyTorch ref us | ours vs ref | DeepGEMM+topk us | ours vs DG |")

    def kfmt(x):
        return f"{x // (1 << 20)}M" if x >= (1 << 20) else f"{x // K}K"

    for r in rows:
        ref, dg, vs, us = r.get("ref_us"), r.get("dg_us"), r.get("vs_L"), r["us"]
        cells = [
            str(r["B"]), kfmt(r["L"]), kfmt(r["max_context"]), str(r["topk"]), f"{us:.1f}", f"{r['GBps']:.0f}",
            f"{r['floor_us']:.1f}", f"{r['pct_floor']:.1f}%",
            "" if vs is None else f"{100 * vs:+.1f}%",
            "" if "exact" not in r else ("yes" if r["exact"] else "NO"),
            "" if ref is None else f"{ref:.0f}", "" if ref is None else f"{ref / us:.0f}x",
            "" if dg is None else f"{dg:.1f}", "" if dg is None else f"{dg / us:.2f}x",
        ]
        print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    sys.exit(main())
