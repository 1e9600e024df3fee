#!/usr/bin/env python3
"""Split (scoring grid + selection grid) vs fused (one cooperative launch) DSA indexer paths.

Same method as bench_dsa_indexer.py (its Timer: CUDA events, 512 MB L2-evicting read before every
repeat, device sleep head start, round-robin, median of --reps), k=2048, max_context = L, next_n = 1.
Per (B, L): split, fused (forced; the chunk grows until the grid is resident at once, "-" if it never
is), the launcher's default, the scoring pass alone, and an exactness check of each path's output
against a top-k of its own scores. Then fused chunk sizes at B=1 L=128K. Writes JSON with --json.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import torch
from harness import (
    Timer,
    indexer_pool,
    sh,
)

from pdserve_kernels.dsa_indexer import DsaIndexer
from pdserve_kernels.reference import PAGE

TOPK = 2048


def exact(ind, q, w, kv, ctx, bt, L, path) -> bool:
    out, sc = ind(q, w, kv, ctx, bt, TOPK, max_len=L, return_scores=True, path=path)
    ref = torch.topk(sc[:, :L], TOPK, dim=1).indices
    kth = torch.gather(sc[:, :L], 1, ref).min(dim=1).values
    mine = torch.gather(sc[:, :L], 1, out.long()).min(dim=1).values
    return bool((mine >= kth).all()) and all(torch.unique(out[r]).numel() == TOPK for r in range(out.shape[0]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--configs", default="1x8192,1x32768,1x131072,1x524288,8x8192,8x32768,8x131072,8x524288,"
                    "32x8192,64x8192,64x32768,128x32768,64x131072")
    ap.add_argument("--chunks", default="6,8,12,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(datetime.datetime.now(datetime.UTC).timestamp()))
    timer = Timer()
    ind = DsaIndexer()
    props = torch.cuda.get_device_properties(0)
    env = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "gpu": props.name,
           "sms": props.multi_processor_count,
           "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
           "torch": torch.__version__, "command": " ".join(sys.argv)}
    print(json.dumps(env), flush=True)
    pool_blocks = max(B * L for B, L in configs) // PAGE
    kv = indexer_pool(pool_blocks, gen)
    maxB = max(B for B, _ in configs)
    q_all = torch.randn((maxB, 1, 64, 128), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w_all = torch.randn((maxB, 64), device="cuda", generator=gen) / 8
    rows = []

    def setup(B, L):
        pages = L // PAGE
        bt = torch.randperm(pool_blocks, device="cuda", generator=gen)[:B * pages].int().view(B, pages).contiguous()
        return q_all[:B].contiguous(), w_all[:B].contiguous(), torch.full((B,), L, dtype=torch.int32, device="cuda"), bt

    for B, L in configs:
        q, w, ctx, bt = setup(B, L)
        fused_ok = ind.fused_chunk_pages(B, L, 1, "wgmma" if ind.capability == (9, 0) else "mma") is not None
        fns = {
            "split": lambda: ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="split"),
            "default": lambda: ind(q, w, kv, ctx, bt, TOPK, max_len=L),
            "score_only": lambda: ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="split", _select=False),
        }
        if fused_ok:
            fns["fused"] = lambda: ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="fused")
        times = dict(zip(fns, timer.medians_us(list(fns.values()), args.reps), strict=False))
        row = dict(B=B, L=L, **{f"{k}_us": v for k, v in times.items()})
        ind(q, w, kv, ctx, bt, TOPK, max_len=L)
        row["default_path"] = list(ind.last_path)
        if fused_ok:
            ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="fused")
            row["fused_chunk"] = ind.last_path[1]
        if B * L <= (8 << 20):
            row["exact_split"] = exact(ind, q, w, kv, ctx, bt, L, "split")
            if fused_ok:
                row["exact_fused"] = exact(ind, q, w, kv, ctx, bt, L, "fused")
        rows.append(row)
        print(json.dumps(row), flush=True)

    B, L = 1, 131072
    q, w, ctx, bt = setup(B, L)
    impl = "wgmma" if ind.capability == (9, 0) else "mma"
    chunks = [int(c) for c in args.chunks.split(",") if ind.fused_chunk_pages(B, L, 1, impl, int(c), grow=False)]
    fns = [(lambda c=c: ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="fused", chunk_pages=c)) for c in chunks]
    fns += [(lambda c=c: ind(q, w, kv, ctx, bt, TOPK, max_len=L, path="split", chunk_pages=c)) for c in chunks]
    ts = timer.medians_us(fns, args.reps)
    sweep = {"B": B, "L": L, "chunks": chunks, "fused_us": ts[:len(chunks)], "split_us": ts[len(chunks):]}
    print(json.dumps(sweep), flush=True)

    print(f"\n# {env['date']} | {env['gpu']} | driver {env['driver']} | torch {env['torch']}")
    print("| B | L | split us | fused us (chunk) | default us (path) | scoring only us | exact split/fused |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fu = f"{r['fused_us']:.1f} ({r['fused_chunk']})" if "fused_us" in r else "- (does not fit)"
        print(f"| {r['B']} | {r['L'] // 1024}K | {r['split_us']:.1f} | {fu} | {r['default_us']:.1f} "
              f"({r['default_path'][0]}) | {r['score_only_us']:.1f} | "
              f"{r.get('exact_split', '')}/{r.get('exact_fused', '')} |")
    print("chunk sweep B=1 L=128K:", " ".join(f"{c}: fused {a:.1f} split {b:.1f};" for c, a, b in
                                              zip(chunks, sweep["fused_us"], sweep["split_us"], strict=False)))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": rows, "sweep": sweep}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
