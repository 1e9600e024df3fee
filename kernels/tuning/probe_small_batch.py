#!/usr/bin/env python3
"""Sparse MLA decode at small batch: where a call's fixed cost goes, and what the split combine's rewrite and
programmatic dependent launch (PDL) change. One process, same inputs, round-robin (harness.Timer: L2 evicted
before every repeat, median). Per shape (h = 16 unless --heads):

  old        the default kernel with the combine of --old-fatbin (a build of the earlier source), if given
  no-pdl     the default, the combine launched after the main kernel
  default    the default, the combine a programmatic dependent launch
  main-only  the default's main kernel alone (wrong output: what the combine adds)
  x2 / t32   twice the default's splits; for fp8 h <= 16 the 32-entry ds kernel at its own split count
  empty      a one-element torch kernel: what the timing method reads for nothing
  sweepN     (--sweep) every 16-head kernel of the layout at N requested splits (none: its own plan)

V4's bf16 cases run from the tuning fatbin beside the production one (harness.MlaLaunchers), "old" only where the old
build has their kernels. Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import torch  # noqa: E402
from harness import MlaLaunchers, Timer, mla_shapes, run_env, seeded_generator  # noqa: E402

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode, layout_refusal  # noqa: E402


def main_only(mla: SparseMlaDecode, call):
    """`call` with mla's combine launches dropped."""
    launch = mla.module.launch

    def skip_combine(name, *a, **kw):
        if name != "sparse_mla_combine":
            launch(name, *a, **kw)

    def run():
        mla.module.launch = skip_combine
        try:
            return call()
        finally:
            mla.module.launch = launch
    return run


def variants(x, new: SparseMlaDecode, old: SparseMlaDecode | None):
    rows = x.B
    plan = new.make_plan(x.layout, rows, x.h, x.ind.shape[-1],
                         x.win_ind.shape[-1] if x.win_ind is not None else 0)
    out = []
    if old is not None:
        out.append(("old", plan.kernel, plan.splits, x.call(old, pdl=False)))   # its combine has no wait
    out += [("no-pdl", plan.kernel, plan.splits, x.call(new, pdl=False)),
            ("default", plan.kernel, plan.splits, x.call(new)),
            ("main-only", plan.kernel, plan.splits, main_only(new, x.call(new)))]
    if plan.splits > 1:
        out.append(("x2", plan.kernel, 2 * plan.splits, x.call(new, kernel=plan.kernel, splits=2 * plan.splits)))
    if not x.lay.bf16 and x.h <= 16:
        name = f"sparse_mla_ds_{x.layout}_h16_t32_s4"
        if name != plan.kernel:
            p2 = new.make_plan(x.layout, rows, x.h, x.ind.shape[-1],
                               x.win_ind.shape[-1] if x.win_ind is not None else 0, kernel=name)
            out.append(("t32", name, p2.splits, x.call(new, kernel=name)))
    return out


def sweep(x, new: SparseMlaDecode):
    """Every 16-head kernel of x's layout at several split counts (--sweep): which one a B=1 call should take."""
    topk_extra = x.win_ind.shape[-1] if x.win_ind is not None else 0
    prefix = {"v4": "v4", "v32": "v32", "v4_bf16": "v4b", "v32_bf16": "v32b"}[x.layout]
    names = [f"sparse_mla_{prefix}_h16_t64", f"sparse_mla_{prefix}_h16_t32"]
    if not x.lay.bf16:
        names += [f"sparse_mla_ds_{x.layout}_h16_t64_s2", f"sparse_mla_ds_{x.layout}_h16_t32_s4"]
    out = []
    for name in names:
        for want in (None, 4, 8, 16, 32, 64):
            try:
                plan = new.make_plan(x.layout, x.B, x.h, x.ind.shape[-1], topk_extra, kernel=name, splits=want,
                                     lossy_bf16_dequant=True)   # pow2 scales: the rounding kernels are exact too
            except ValueError:
                continue
            if any(o[1] == name and o[2] == plan.splits for o in out):
                continue
            out.append((f"sweep{'' if want is None else want}", name, plan.splits,
                        x.call(new, kernel=name, splits=plan.splits, lossy_bf16_dequant=True)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-fatbin", default=None)
    ap.add_argument("--cases", default="v4-csa,v4-hca,v32,v4-csa-bf16,v4-hca-bf16,v32-bf16")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--heads", default="16")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="also every 16-head kernel at several split counts")
    args = ap.parse_args()
    gen = seeded_generator()
    timer = Timer()
    launchers = MlaLaunchers()   # V4's bf16 cases: the tuning fatbin beside the production one
    old = SparseMlaDecode(fatbin=args.old_fatbin) if args.old_fatbin else None
    print(json.dumps(run_env()), flush=True)
    tiny = torch.zeros(1, device="cuda")
    empty = timer.median_us(lambda: tiny.add_(1), args.reps)
    print(f"empty kernel: {empty:.1f} us")
    rows = []
    print("| case | B | h | variant | kernel (splits) | us | rel err vs ref |")
    print("|---|---|---|---|---|---|---|")
    for x in mla_shapes(args.cases.split(","), [int(b) for b in args.batches.split(",")],
                        [int(h) for h in args.heads.split(",")], gen):
        new = launchers.for_layout(x.layout)
        old_x = old if old is not None and layout_refusal(x.layout, old.kernels) is None else None
        vs = variants(x, new, old_x) + (sweep(x, new) if args.sweep else [])
        ts = timer.medians_us([v[3] for v in vs], args.reps)
        ref_out, _ = x.reference(rows=2)
        for (label, kernel, splits, fn), t in zip(vs, ts, strict=False):
            err = x.rel_err(fn()[0], ref_out) if label != "main-only" else float("nan")
            rows.append({"case": x.case, "B": x.B, "h": x.h, "variant": label, "kernel": kernel, "splits": splits,
                         "us": round(t, 2), "rel_err": err})
            print(f"| {x.case} | {x.B} | {x.h} | {label} | {kernel.replace('sparse_mla_', '')} ({splits}) | "
                  f"{t:.1f} | {err:.1e} |", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"empty_us": empty, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
