#!/usr/bin/env python3
"""Where a one-row call's time goes on the first-version kernels: the tuning build's `_tl` kernels are the 8-warp
first-version kernels with clock64 / globaltimer readings per CTA at their phases (MlaTlSlot in
sparse_mla_decode.h), and `sparse_mla_combine_tl` / `_b8_tl` the split combines with the times each CTA enters,
gets past griddepcontrol.wait and leaves; all written to the counters pointer, which these kernels do not use
otherwise. Per shape (case:B, 16 heads), over --reps calls each after an L2 flush and a sleep (as harness.Timer),
timed by CUDA events around the call as the benchmark does, it prints medians of:
  * the call as the events read it, and the spans inside it (ns of the global timer, from the first main CTA's
    entry): the last main CTA's entry and exit, the first and last combine CTA's entry, the last past its wait,
    the last exit; what the events read beyond the first entry to the last exit is launch and event overhead;
  * each main CTA's phases in microseconds (cycles / the CTA's own clock rate from its two globaltimer readings),
    the median CTA and the slowest.
The output is checked against the default call's. --per-split also times each shape with fewer entries per
split CTA than the plan's (the row spread over more SMs; per-SM memory parallelism bounds one CTA's gather), and
--pool-entries draws the indices from a smaller cache (fewer pages: whether address translation matters).

Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import torch  # noqa: E402
from cta_stamps import clock_ghz, phases_us, timeline_args  # noqa: E402
from harness import CASES, mla_batch, mla_pool, probe_setup  # noqa: E402

from pdserve_kernels.sparse_mla_decode import DV  # noqa: E402

# MlaTlSlot and the combine's words (sparse_mla_decode.h)
(ENTRY_NS, ENTRY, INDICES, ISSUED, LANDED, CONVERTED, QK, MAX, SOFTMAX, PV, END, EXIT_NS) = range(12)
WORDS, COMBINE_BASE, COMBINE_WORDS = 16, 4096, 4
PHASES = [  # (label, from slot, to slot), cycles of one CTA
    ("entry -> index list landed (Q requested)", ENTRY, INDICES),
    ("-> tile 0's gather requested", INDICES, ISSUED),
    ("-> tile 0 landed", ISSUED, LANDED),
    ("-> dequantized (fp8)", LANDED, CONVERTED),
    ("-> QK (warp 0)", CONVERTED, QK),
    ("-> row maxima exchanged", QK, MAX),
    ("-> P and sums (softmax)", MAX, SOFTMAX),
    ("-> PV done (warp 0)", SOFTMAX, PV),
    ("-> partial's stores issued", PV, END),
    ("entry -> end", ENTRY, END),
]


def main() -> int:
    ap = timeline_args(__doc__, shapes="v4-csa:1,v4-hca:1,v4-csa-bf16:1,v4-hca-bf16:1", reps=30)
    ap.add_argument("--per-split", default="",
                    help="comma-separated entries per split CTA to time besides the plan's (fewer than the 64-entry "
                         "tile too: the row spread over more SMs, the combine merging more splits)")
    args = ap.parse_args()

    gen, timer, mla, env = probe_setup(args.fatbin)
    launch = mla.module.launch

    def launch_tl(name, *a, **k):   # the combine the launcher picks, as its timeline twin
        return launch(name + "_tl" if name.startswith("sparse_mla_combine") else name, *a, **k)

    pools: dict = {}
    results = []
    per_splits = [None] + [int(v) for v in args.per_split.split(",") if v]
    specs = [(spec, ps) for spec in args.shapes.split(",") for ps in per_splits]
    for spec, per_split in specs:
        case, B = spec.split(":")
        B, h = int(B), 16
        layout = CASES[case][0]
        mla_pool(layout, layout, args.pool_entries, pools, gen)   # mla_batch then takes these caches
        mla_pool("win-" + layout, layout, min(1 << 17, args.pool_entries), pools, gen)
        (x,) = mla_batch(case, B, [h], gen, pools)
        name = "sparse_mla_v4_h16_t64_tl" if layout == "v4" else "sparse_mla_v4b_h16_t64_tl"
        topk_extra = x.win_ind.shape[-1] if x.win_ind is not None else 0
        plan = mla.make_plan(x.layout, B, h, x.ind.shape[-1], topk_extra, kernel=name)
        if per_split is not None:
            ntot = plan.topk + plan.topk_extra
            plan = dataclasses.replace(plan, per_split=per_split, splits=-(-ntot // per_split))
        ctas = plan.grid[0] * plan.grid[1] * plan.grid[2]
        combine_ctas = plan.h * plan.rows if plan.splits > 1 else 0
        stamps = torch.zeros(COMBINE_BASE + COMBINE_WORDS * max(combine_ctas, 1), dtype=torch.int64, device="cuda")
        out = torch.empty((B, 1, h, DV), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((B, 1, h), dtype=torch.float32, device="cuda")
        rows = plan.rows
        ws = torch.empty(rows * plan.splits * h * (DV + 1), dtype=torch.float32, device="cuda")
        ref, _ = x.call(mla)()
        extra_kv = x.extra.get("extra_kv", x.kv)
        e3 = x.extra.get("extra_indices", x.ind)

        def call():
            mla.launch(plan, x.q, x.kv, x.ind, x.sm_scale, sinks=x.sinks, extra_kv=extra_kv, e3=e3, out=out, lse=lse,
                       o_part_ptr=ws.data_ptr(), lse_part_ptr=ws.data_ptr() + 4 * rows * plan.splits * h * DV,
                       counters_ptr=stamps.data_ptr())

        mla.module.launch = launch_tl
        try:
            call()
            torch.cuda.synchronize()
            per_rep, event_us = [], []
            for _ in range(args.reps):
                stamps.zero_()
                timer.buf.view(torch.int64).sum()
                torch.cuda._sleep(timer.head_start)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                call()
                e.record()
                torch.cuda.synchronize()
                event_us.append(s.elapsed_time(e) * 1e3)
                per_rep.append(stamps.cpu())
        finally:
            mla.module.launch = launch
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        st = torch.stack(per_rep).double()
        main_st = st[:, :ctas * WORDS].view(args.reps, ctas, WORDS)
        ghz = clock_ghz(main_st, ENTRY, END, ENTRY_NS, EXIT_NS)
        t0 = main_st[..., ENTRY_NS].amin(1)                                              # [reps]
        spans = {"events: the call": torch.tensor(event_us).double(),
                 "main: last CTA entered": (main_st[..., ENTRY_NS].amax(1) - t0) / 1e3,
                 "main: first CTA left": (main_st[..., EXIT_NS].amin(1) - t0) / 1e3,
                 "main: last CTA left": (main_st[..., EXIT_NS].amax(1) - t0) / 1e3}
        if combine_ctas:
            c = st[:, COMBINE_BASE:COMBINE_BASE + combine_ctas * COMBINE_WORDS].view(args.reps, combine_ctas,
                                                                                   COMBINE_WORDS)
            spans.update({"combine: first CTA entered": (c[..., 0].amin(1) - t0) / 1e3,
                          "combine: last CTA entered": (c[..., 0].amax(1) - t0) / 1e3,
                          "combine: first past its wait": (c[..., 1].amin(1) - t0) / 1e3,
                          "combine: last past its wait": (c[..., 1].amax(1) - t0) / 1e3,
                          "combine: last CTA left": (c[..., 2].amax(1) - t0) / 1e3})
        res = {"case": case, "B": B, "h": h, "kernel": name, "splits": plan.splits, "per_split": plan.per_split,
               "ctas": ctas, "combine_ctas": combine_ctas,
               "pool_entries": args.pool_entries,
               "rel_err_vs_default": err, "ghz": statistics.median(ghz.flatten().tolist()),
               "spans_us": {k: statistics.median(v.tolist()) for k, v in spans.items()},
               "phases_us": phases_us(main_st, PHASES, ghz)}
        results.append(res)
        print(json.dumps(res), flush=True)
        print(f"\n## {case} B={B} h={h}: {name} ({plan.splits} splits of {plan.per_split}, {ctas} CTAs; "
              f"{combine_ctas} combine CTAs), {res['ghz']:.2f} GHz, "
              f"pool of {args.pool_entries} entries, output vs default {err:.1e}")
        print("| span from the first main CTA's entry | us |\n|---|---|")
        for k, v in res["spans_us"].items():
            print(f"| {k} | {v:.2f} |")
        print("| phase of a main CTA | median CTA us | slowest CTA us |\n|---|---|---|")
        for k, (med, worst) in res["phases_us"].items():
            print(f"| {k} | {med:.2f} | {worst:.2f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
