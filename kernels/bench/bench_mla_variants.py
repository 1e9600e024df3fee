#!/usr/bin/env python3
"""Variant table (not THE benchmark): fp8 sparse MLA decode, the launcher's default ("auto", exact on any fp32
scale) and its lossy opt-in's choice ("fastest", lossy_bf16_dequant=True, where it differs) against every kernel of
the fatbin that can serve the shape (named kernels run with the opt-in: these inputs' scales are powers of two, where
the kernels that round e4m3 x scale are exact too), timed round-robin in one process on the same inputs:
the first-version kernel ("old"), every "ds" kernel of the head block (16 heads for h <= 16, else 32), and on
sm_90a for h > 32 every "wg" kernel of the layout (64-head blocks; for V3.2 also the exact-scale "wge" kernels
wg_v32_s3_e and wg_v32_s3_e_c2, on these power-of-two-scale inputs like the others). Each candidate is also checked
against the fp32 reference (first rows). The launcher's fastest choice is chosen from this table (auto_fp8_kernel;
NOTES.md records what it showed).

Options: --fused also times the ds default with the fused split-combine, and the default kernel fused where it
merges its splits itself (the wg kernels' split pairs); --splits 1,2,3 times the default kernel at those split
counts (fused too with --fused); --kernels REGEX times only the kernels whose name matches, beside the default.
Timing as bench_sparse_mla.py (harness.Timer: CUDA events, L2 evicted before
every repeat, median). One table per run. Merges the former bench_mla_variants.py (ds) and bench_wg.py (wg).
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import MlaLaunchers, Timer, finish, mla_shapes, run_env, seeded_generator, table_head

from pdserve_kernels.sparse_mla_decode import kernel_shape


def candidates(mla, layout: str, h: int, rows: int, entries: int,
               only: re.Pattern | None = None) -> list[tuple[str, str, dict]]:
    """(label, kernel name, extra call arguments): the default first, then every kernel that serves h heads (with
    `only`, those whose name it matches, first-version kernels included)."""
    out = [("auto", mla.pick_kernel(layout, h, variant="auto", rows=rows, entries=entries), {})]
    fastest = mla.pick_kernel(layout, h, variant="auto", rows=rows, entries=entries, lossy_bf16_dequant=True)
    if fastest != out[0][1]:
        out.append(("fastest", fastest, {}))
    old = mla.pick_kernel(layout, h, variant="")
    if only is None and old in mla.kernels:   # (V3.2's at 16 and 64 heads are retired: tuning fatbin)
        out.append(("old", old, {}))
    for name, info in sorted(mla.kernels.kernels.items()):
        if info.family not in ("ds", "wg", "mla") or kernel_shape(info)[0] != layout or info.shape.get("probe"):
            continue
        if only is not None and not only.search(name):
            continue
        if info.family == "mla" and (only is None or info.shape["heads"] != (16 if h <= 16 else 32 if h <= 32 else 64)):
            continue   # first-version kernels only when asked for by name (the default is "auto", the first "old")
        if info.family == "ds" and info.shape["heads"] != (16 if h <= 16 else 32):
            continue
        # sm_90a; 64-head blocks, from 33 heads (the wgt kernels, 64-entry tiles, at every head count; any asked for by
        # name)
        if info.family == "wg" and (mla.capability[0] != 9
                                    or (h <= 32 and kernel_shape(info)[2] != 64 and only is None)):
            continue
        if -(-h // 64) % info.shape.get("cluster_head_blocks", 1):   # launched in clusters of head blocks
            continue
        out.append((name.replace("sparse_mla_", ""), name, {}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--batches", default="1,8,64,128")
    ap.add_argument("--heads", default="16,32,64,128")
    ap.add_argument("--cases", default="v4-csa,v4-hca,v32")
    ap.add_argument("--fused", action="store_true",
                    help="also the ds default and (where it fuses) the default kernel with the fused split-combine")
    ap.add_argument("--splits", default="", help="comma-separated split counts to time the default kernel at")
    ap.add_argument("--kernels", default=None, metavar="REGEX",
                    help="time only the kernels whose name matches (besides the default), e.g. 't64a|s3_c2_m'")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    gen = seeded_generator()
    timer = Timer()
    launchers = MlaLaunchers()   # a bf16 V4 case (--cases v4-csa-bf16) runs from the tuning fatbin
    env = run_env()
    print(json.dumps(env), flush=True)
    split_list = [int(s) for s in args.splits.split(",") if s]
    rows_out = []
    for x in mla_shapes(args.cases.split(","), [int(b) for b in args.batches.split(",")],
                        [int(h) for h in args.heads.split(",")], gen):
        B, h = x.B, x.h
        mla = launchers.for_layout(x.layout)
        cands = candidates(mla, x.layout, h, B, x.n_valid, re.compile(args.kernels) if args.kernels else None)
        auto = cands[0][1]
        cands += [(f"auto, {s} splits", auto, {"splits": s}) for s in split_list]
        if args.fused:
            ds = mla.pick_kernel(x.layout, h, variant="ds", rows=B, entries=x.n_valid)
            cands.append(("ds default fused", ds, {"fuse_combine": True}))

            def fuses(kw):   # the default kernel merges these splits itself (fused_counters_per_block)
                return mla.make_plan(x.layout, B, h, x.ind.shape[-1],
                                     x.win_ind.shape[-1] if x.win_ind is not None else 0, kernel=auto,
                                     fuse_combine=True, lossy_bf16_dequant=True, **kw).fuse_combine
            cands += [(f"auto{f', {s} splits' if s else ''} fused", auto, {"fuse_combine": True, **kw})
                      for s, kw in [(None, {})] + [(s, {"splits": s}) for s in split_list] if fuses(kw)]
        ro, _ = x.reference(2)
        fns, info = [], {}
        for label, name, kw in cands:
            if label in ("auto", "fastest"):   # the launcher's own choice: kernel, splits, the _m variant of two
                choice = {"lossy_bf16_dequant": label == "fastest"}
                call = x.call(mla, **choice, **kw)
                plan = mla.make_plan(x.layout, B, h, x.ind.shape[-1],
                                     x.win_ind.shape[-1] if x.win_ind is not None else 0, **choice)
                name, n_splits = plan.kernel, plan.splits
            else:
                call = x.call(mla, kernel=name, lossy_bf16_dequant=True, **kw)
                n_splits = mla.plan(name, B, h, x.n_valid, kw.get("splits"))[0]
            out, _ = call()
            info[label] = {"kernel": name, "splits": n_splits, "rel_err": x.rel_err(out, ro)}
            fns.append(call)
        ts = timer.medians_us(fns, args.reps)
        us = {label: round(t, 2) for (label, _, _), t in zip(cands, ts, strict=False)}
        row = {"case": x.case, "B": B, "h": h, "us": us, "info": info}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    return finish(env, rows_out, args.json, print_table)


def print_table(env, rows) -> None:
    table_head(env, "", "| case | B | h | auto kernel (splits) | auto us | best us (kernel) | auto / best | "
                        "every candidate us | max rel err |")
    for row in rows:
        us, info = row["us"], row["info"]
        others = {k: v for k, v in us.items() if k != "auto"} or {"auto": us["auto"]}
        best = min(others, key=others.get)
        cells = [row["case"], str(row["B"]), str(row["h"]),
                 f"{info['auto']['kernel'].replace('sparse_mla_', '')} ({info['auto']['splits']})",
                 f"{us['auto']:.1f}", f"{others[best]:.1f} ({best})", f"{us['auto'] / others[best]:.2f}",
                 ", ".join(f"{k} {v:.1f}" for k, v in others.items()),
                 f"{max(v['rel_err'] for v in info.values()):.1e}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
