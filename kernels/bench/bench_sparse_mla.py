#!/usr/bin/env python3
"""Sparse MLA decode benchmark (the decode section of the kernels' benchmark; BENCHMARKS.md records it).

Shapes: h in {16, 32, 64, 128}, B in {1, 8, 64, 128}, one query token per request, page 64:
  v4-csa: V4-Flash CSA layer, 512 selected compressed entries + 128 window entries (second cache), 584 B;
  v4-hca: V4-Flash HCA layer at L = 128K: all 1024 compressed entries (128:1) + 128 window entries;
  v32:    V3.2 top-2048, FP8 656 B;
  *-bf16: the same with bf16 KV (V4: 1024 B/entry, K = V; V3.2: 1152 B/entry, V = first 512 dims). V4's bf16 rows
          run from the tuning fatbin beside the production one (harness.MlaLaunchers; row "fatbin"): the production
          build has no bf16 V4 kernels, since SGLang's V4 cache is FP8.
Per case: median time of our kernel (CUDA events, L2 evicted before every repeat by the indexer
benchmark's Timer, >= 30 repeats), GB/s on unique bytes (distinct selected entries x entry bytes + q +
out + lse + indices), TFLOP/s on useful FLOPs (2 h N (d_qk + 512) per row, N = valid entries), the floor
= max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both measured at the start of this run, and the
relative error of our output against the fp32 reference on the first rows. The PyTorch reference
(`reference_decode`: gather, dequantize, einsum) is timed on a subset. When `flash_mla` is importable
(built from .ext/flashmla, see flashmla_adapter.py), the fp8 cases also time FlashMLA's sparse decode on the
same inputs, round-robin with ours (same timer, flush and repeats), and check its output against the same
reference; FlashMLA takes only 64 or 128 heads, so h = 16 / 32 run it zero-padded to 64.
Ours is the launcher's default, exact on any fp32 scale; --lossy times the faster lossy opt-in
(lossy_bf16_dequant=True: V3.2 rounds e4m3 x scale to bf16; exact on these inputs' power-of-two scales).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from flashmla_adapter import FLASHMLA_COMMIT, FlashMlaDecode
from flashmla_adapter import load as load_flashmla
from harness import (
    CASES,
    MlaLaunchers,
    Timer,
    copy_bandwidth,
    finish,
    floor_us,
    matmul_tflops,
    mla_shapes,
    run_env,
    seeded_generator,
    table_head,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batches", default="1,8,64,128")
    ap.add_argument("--heads", default="16,32,64,128")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--ref-reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep-splits", action="store_true", help="also time fixed split counts at B=64")
    ap.add_argument("--lossy", action="store_true", help="the lossy opt-in (lossy_bf16_dequant=True) for ours")
    args = ap.parse_args()
    choice = {"lossy_bf16_dequant": args.lossy}
    assert args.reps >= 30 and args.ref_reps >= 30, "the benchmark contract is >= 30 repeats"

    gen = seeded_generator()
    # ~100 us head start (the indexer benchmark's 20 us was shorter than this launcher's Python overhead with
    # a split + combine, which then landed inside the timed region: the small-B noise of the earlier table).
    timer = Timer()
    launchers = MlaLaunchers()
    env = run_env(sparse_mla_choice="lossy opt-in (lossy_bf16_dequant=True)" if args.lossy else "exact default")
    fm, fm_why = load_flashmla()
    env["flash_mla"] = f"importable (adapter written for {FLASHMLA_COMMIT[:8]})" if fm else "not importable"
    if fm is None:
        print(f"flash_mla not importable ({fm_why}): the FlashMLA columns stay empty", flush=True)
    fm_failed = set()   # cases whose FlashMLA error was printed already
    env["copy_GBps"] = round(copy_bandwidth(timer), 1)
    env["matmul_TFLOPs"] = round(matmul_tflops(timer), 1)
    print(json.dumps(env), flush=True)

    rows_out = []
    for x in mla_shapes(args.cases.split(","), [int(b) for b in args.batches.split(",")],
                        [int(h) for h in args.heads.split(",")], gen):
        B, h, lay = x.B, x.h, x.lay
        mla = launchers.for_layout(x.layout)
        fm_call = fm_err = None
        if fm is not None and not lay.bf16:   # FlashMLA's sparse decode is fp8-only
            try:   # its first call (which builds its tile schedule) runs here, outside the timing
                fm_call = FlashMlaDecode(fm, x.q, x.kv, x.ind, x.sm_scale, x.sinks, **x.extra)
            except Exception as e:  # noqa: BLE001 - a shape FlashMLA refuses is recorded, ours still timed
                fm_err = f"{type(e).__name__}: {e}"
                if x.case not in fm_failed:
                    fm_failed.add(x.case)
                    print(f"FlashMLA failed on {x.case} (B={B}, h={h}): {fm_err}", flush=True)
        ts = timer.medians_us([x.call(mla, **choice)] + ([fm_call] if fm_call else []), args.reps)
        t = ts[0]
        plan = mla.make_plan(x.layout, B, h, x.ind.shape[-1],   # what the default call runs
                             x.win_ind.shape[-1] if x.win_ind is not None else 0, **choice)
        name, splits = plan.kernel, plan.splits
        bytes_, flops = x.bytes_flops()
        floor = floor_us(bytes_, flops, env["copy_GBps"], env["matmul_TFLOPs"])
        row = {"case": x.case, "B": B, "h": h, "entries": x.n_valid, "kernel": name, "splits": splits, "us": t,
               "GBps": bytes_ / (t * 1e-6) / 1e9, "TFLOPs": flops / (t * 1e-6) / 1e12, "floor_us": floor,
               "pct_floor": 100 * floor / t, "bytes": bytes_, "flops": flops, "fatbin": mla.path.name}
        # Correctness on this shape: first rows against the fp32 reference.
        ro, rl = x.reference(4)
        r = ro.shape[0]
        out, lse = x.call(mla, **choice)()
        row["rel_err"] = x.rel_err(out, ro)
        row["lse_err"] = (lse[:r].view(r, h) - rl).abs().max().item()
        if fm_call is not None:
            row.update(flashmla_us=ts[1], ours_over_flashmla=t / ts[1], flashmla_heads=fm_call.heads,
                       flashmla_rel_err=x.rel_err(fm_call.first, ro))
        elif fm_err is not None:
            row["flashmla_error"] = fm_err[:300]
        if B in (1, 8, 64) and h in (16, 64):
            row["ref_us"] = timer.median_us(x.reference, args.ref_reps)
        if args.sweep_splits and B == 64:
            alts = [s for s in (1, 2, 3, 4) if s != splits]
            ts = timer.medians_us([x.call(mla, splits=s, **choice) for s in alts], args.reps)
            row["splits_sweep"] = {str(s): round(v, 2) for s, v in zip(alts, ts, strict=False)}
        if args.sweep_splits and B in (64, 128):
            # The 16-head, 32-entry kernel (97-108 KB of smem: two CTAs per SM) at 1x and 2x the splits.
            small = mla.pick_kernel(x.layout, h, small=True)
            s1, _ = mla.plan(small, B, h, x.n_valid)
            ts = timer.medians_us([x.call(mla, kernel=small, splits=s, lossy_bf16_dequant=True)   # power-of-two
                                   for s in (s1, 2 * s1)], args.reps)
            row["small_kernel"] = {str(s1): round(ts[0], 2), str(2 * s1): round(ts[1], 2)}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    return finish(env, rows_out, args.json, print_table)


def print_table(env, rows) -> None:
    table_head(env, f" | {env['nvcc']} | copy {env['copy_GBps']} GB/s | bf16 matmul {env['matmul_TFLOPs']} TFLOP/s | "
               f"FlashMLA: {env.get('flash_mla', 'not importable')}",
               "| case | B | h | kernel (splits) | ours us | GB/s | TFLOP/s | floor us | % of floor | rel err | "
               "PyTorch ref us | ours vs ref | FlashMLA us | ours / FlashMLA | FlashMLA rel err |")
    for r in rows:
        ref, fmu = r.get("ref_us"), r.get("flashmla_us")
        fm_cell = "" if fmu is None else f"{fmu:.1f}" + (f" (h {r['flashmla_heads']})"
                                                         if r["flashmla_heads"] != r["h"] else "")
        cells = [r["case"], str(r["B"]), str(r["h"]), f"{r['kernel'].replace('sparse_mla_', '')} ({r['splits']})",
                 f"{r['us']:.1f}", f"{r['GBps']:.0f}", f"{r['TFLOPs']:.0f}", f"{r['floor_us']:.1f}",
                 f"{r['pct_floor']:.1f}%", f"{r['rel_err']:.1e}",
                 "" if ref is None else f"{ref:.0f}", "" if ref is None else f"{ref / r['us']:.0f}x",
                 fm_cell if "flashmla_error" not in r else "error",
                 "" if fmu is None else f"{r['us'] / fmu:.2f}",
                 "" if fmu is None else f"{r['flashmla_rel_err']:.1e}"]
        print("| " + " | ".join(cells) + " |")
    if any("flashmla_us" in r for r in rows):
        print("ours / FlashMLA: ours us / FlashMLA us (below 1: ours is faster). FlashMLA takes only 64 or 128 "
              "heads: \"(h 64)\" marks rows it ran with q zero-padded to 64 heads, padded heads' work included.")


if __name__ == "__main__":
    sys.exit(main())
