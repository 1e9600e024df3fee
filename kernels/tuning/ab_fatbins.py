#!/usr/bin/env python3
"""Sparse MLA decode, several builds on the same inputs: the launcher's default call with the fatbin it finds
(PDSERVE_SPARSE_MLA_FATBIN or kernels/build: "new") and with each --build label=path (another build, of earlier
source or other build-time settings, with its .json beside it; the first is the table's reference), timed
round-robin in one process (harness.Timer: L2 evicted before every repeat, median),
FlashMLA beside them where it runs the shape (importable, fp8, h padded to 64 or 128). Both builds' outputs are
checked against the fp32 reference on the first rows.

--topk 512,1024,2048 times each shape at those numbers of entries selected from the main cache (the window of
the V4 cases unchanged) and fits time = fixed + per_tile x tiles (least squares over the 64-entry tiles per
row): how much of a call is paid once, before and after the first tile, and how much per tile.

--cache cold,primed,warm times each shape in those cache states: cold (the benchmark's: L2 evicted), primed (L2
evicted, then the same launcher called on other inputs of the same shape: the code, the launch path and the
combine warm, the timed call's data cold; columns "label@primed"), primed1 (as primed, but the primer is the same
kernel and splits on one row: the code is in L2 and in one or two SMs' instruction caches, the other SMs' caches cold)
and warm (nothing evicted: "label@warm").

Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import flashmla_adapter  # noqa: E402
from harness import Timer, finish, mla_batch, run_env, seeded_generator, table_head  # noqa: E402

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode  # noqa: E402


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(fixed, per_tile) of time = fixed + per_tile x tiles by least squares; None with fewer than two sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, metavar="LABEL=FATBIN",
                    help="another build to time beside the default one (repeatable; the first is the reference)")
    ap.add_argument("--shapes", default="v32:64:128,v4-csa:64:128,v32:64:64,v4-csa:64:16,v4-csa:1:16,v32:1:16",
                    help="case:B:h,...")
    ap.add_argument("--topk", default="", help="entries selected from the main cache, comma-separated")
    ap.add_argument("--cache", default="cold", help="cold, primed, primed1, warm: comma-separated cache states")
    ap.add_argument("--fused", action="store_true",
                    help="also the default build with fuse_combine=True (label new+fused), loaded as a module of its "
                         "own so that its code is as cold as every other column's")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--lossy", action="store_true",
                    help="every build with lossy_bf16_dequant=True (the fastest choice; exact on these pow2 scales)")
    args = ap.parse_args()
    modes = args.cache.split(",")
    if not modes or not set(modes) <= {"cold", "primed", "primed1", "warm"}:
        ap.error(f"--cache {args.cache!r}: a comma-separated list of cold, primed, primed1, warm")

    gen = seeded_generator()
    timer = Timer()
    builds = [tuple(b.split("=", 1)) for b in args.build]
    new = SparseMlaDecode()
    choice = {"lossy_bf16_dequant": True} if args.lossy else {}   # else the exact default
    launchers = [(label, SparseMlaDecode(fatbin=path), dict(choice)) for label, path in builds] + [("new", new, choice)]
    if args.fused:
        launchers.append(("new+fused", SparseMlaDecode(), {"fuse_combine": True, **choice}))
    fm, why = flashmla_adapter.load()
    env = run_env(builds=dict(builds), flashmla=why or flashmla_adapter.FLASHMLA_COMMIT)
    print(json.dumps(env), flush=True)
    topks = [int(k) for k in args.topk.split(",") if k] or [None]
    pools: dict = {}
    primer_pools: dict = {}   # the primers' own caches: priming must not bring the timed call's entries into L2
    rows = []
    for spec in args.shapes.split(","):
        case, B, h = spec.split(":")
        B, h = int(B), int(h)
        for k in topks:
            (x,) = mla_batch(case, B, [h], gen, pools, k_main=k)
            (x2,) = mla_batch(case, B, [h], gen, primer_pools, k_main=k) if "primed" in modes else (None,)
            (x1,) = mla_batch(case, 1, [h], gen, primer_pools, k_main=k) if "primed1" in modes else (None,)
            ro, _ = x.reference(2)
            labels, fns, primers, primers1, err = [], [], [], [], {}
            for label, mla, kw in launchers:
                call = x.call(mla, **kw)
                out, _ = call()
                err[label] = x.rel_err(out, ro)
                labels.append(label)
                fns.append(call)
                primers.append(x2.call(mla, **kw) if x2 is not None else None)
                if x1 is not None:
                    lp = mla.make_plan(x.layout, B, h, x.ind.shape[-1],
                                       x.win_ind.shape[-1] if x.win_ind is not None else 0, **choice)
                    primers1.append(x1.call(mla, kernel=lp.kernel, splits=lp.splits, **kw))
            if fm is not None and not x.lay.bf16 and flashmla_adapter.padded_heads(h):
                try:
                    def flashmla(y):
                        return flashmla_adapter.FlashMlaDecode(fm, y.q, y.kv, y.ind, y.sm_scale, y.sinks,
                                                               extra_kv=y.extra.get("extra_kv"),
                                                               extra_indices=y.extra.get("extra_indices"))
                    f = flashmla(x)
                    f2 = flashmla(x2) if x2 is not None else None
                    f1 = flashmla(x1) if x1 is not None else None
                    err["flashmla"] = x.rel_err(f.first, ro)
                    labels.append("flashmla")
                    fns.append(f)
                    primers.append(f2)
                    primers1.append(f1)
                except Exception as e:  # noqa: BLE001 - a shape FlashMLA refuses: time ours only
                    print(f"# flashmla {spec} topk {k}: {type(e).__name__}: {e}", flush=True)
            timed_labels, ts = [], []
            for mode in modes:
                chosen = {"primed": primers, "primed1": primers1}.get(mode)
                ts += timer.medians_us(fns, args.reps, primers=chosen, flush=mode != "warm")
                timed_labels += [lab if mode == "cold" else f"{lab}@{mode}" for lab in labels]
            plan = new.make_plan(x.layout, B, h, x.ind.shape[-1], x.win_ind.shape[-1] if x.win_ind is not None else 0,
                                 **choice)
            row = {"case": case, "B": B, "h": h, "entries": x.n_valid, "tiles": -(-x.n_valid // 64),
                   "kernel": plan.kernel.replace("sparse_mla_", ""), "splits": plan.splits,
                   "us": {lab: round(t, 2) for lab, t in zip(timed_labels, ts, strict=False)}, "rel_err": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return finish(env, rows, args.json, print_table)


def mode_of(label: str) -> str:
    return label.partition("@")[2]


def print_table(env, rows) -> None:
    """One column per build and cache state; ratios against the first build in the same cache state."""
    labels = [lab for lab in rows[0]["us"] if not lab.startswith("flashmla")] if rows else []
    refs: dict = {}
    for lab in labels:
        refs.setdefault(mode_of(lab), lab)
    ratios = [lab for lab in labels if refs[mode_of(lab)] != lab]
    fm_labels = sorted({lab for r in rows for lab in r["us"] if lab.startswith("flashmla")},
                       key=lambda lab: (mode_of(lab) != "", lab))
    table_head(env, "", "| case | B | h | entries | kernel (splits) | " + " | ".join(f"{lab} us" for lab in labels)
               + "".join(f" | {lab} / {refs[mode_of(lab)]}" for lab in ratios)
               + "".join(f" | {lab} us" for lab in fm_labels) + " | max rel err |")
    for r in rows:
        us = r["us"]
        print(f"| {r['case']} | {r['B']} | {r['h']} | {r['entries']} | {r['kernel']} ({r['splits']}) | "
              + " | ".join(f"{us[lab]:.1f}" for lab in labels)
              + "".join(f" | {us[lab] / us[refs[mode_of(lab)]]:.2f}" for lab in ratios)
              + "".join(f" | {us[lab]:.1f}" if lab in us else " | -" for lab in fm_labels)
              + f" | {max(r['rel_err'].values()):.1e} |")
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["case"], r["B"], r["h"]), []).append(r)
    fits = [(key, g) for key, g in groups.items() if len({r["tiles"] for r in g}) > 1]
    if fits:
        print("\n| case | B | h | who | fixed us | us per 64-entry tile |")
        print("|---|---|---|---|---|---|")
        for (case, B, h), g in fits:
            for who in g[0]["us"]:
                f = fit([(r["tiles"], r["us"][who]) for r in g if who in r["us"]])
                if f:
                    print(f"| {case} | {B} | {h} | {who} | {f[0]:.1f} | {f[1]:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
