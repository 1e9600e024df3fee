#!/usr/bin/env python3
"""Where a cluster-pair (_t64x) call's time goes: the tuning build's `_t64x_tl` kernels are the production _t64x with
clock64 / globaltimer readings per CTA at its phases and per-phase sums over the tiles (WgtStamp in
kernels/sparse_mla_decode/wgt.cuh), written into the split workspace pointer, which one split leaves unused. Per shape
(case:B:h, and --topk entries from the main cache), over --reps launches each after an L2 flush and a sleep (as
harness.Timer), it prints the median over CTAs (and the slowest CTA) of each phase in microseconds (cycles / the CTA's
own clock rate from its two globaltimer readings), and the spread of the CTAs' start times. The output is checked
against the default kernel's.

Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import torch  # noqa: E402
from cta_stamps import clock_ghz, median_and_slowest_us, phases_us, timeline_args  # noqa: E402
from harness import CASES, mla_batch, mla_pool, probe_setup  # noqa: E402

# WgtStamp's slots
(ENTRY_NS, ENTRY, PROLOGUE, T0_READY, T0_QK, T0_PV, LOOP, WRITTEN, EXIT, EXIT_NS, P_T0, P_DONE, P_EXIT, W1_DONE,
 W1_WRITTEN, WAIT_FULL, P_AVAIL, P_LOADS, P_CONVERT, P_HAND, P_INDEX, W0_QK, W0_SOFTPV, P_IDX01, P_LOADS0,
 Q_READY) = range(26)
WORDS = 32
SUMS = [  # (label, slot): cycles summed over a CTA's tiles
    ("wg0: waiting for full tiles", WAIT_FULL),
    ("wg0: QK", W0_QK),
    ("wg0: softmax + PV", W0_SOFTPV),
    ("producer: waiting for a free buffer", P_AVAIL),
    ("producer: waiting for its entry loads", P_LOADS),
    ("producer: converting (into registers, before the wait)", P_CONVERT),
    ("producer: storing the tile, fence, bulk copy, barrier", P_HAND),
    ("producer: issuing the next tile's loads and index", P_INDEX),
]
PHASES = [  # (label, from slot, to slot): cycles between two readings of one CTA
    ("prologue (Q, first indices, barriers)", ENTRY, PROLOGUE),
    ("producer: indices of tiles 0, 1 here, from entry", ENTRY, P_IDX01),
    ("producer: entries of tiles 0, 1 here, from entry", ENTRY, P_LOADS0),
    ("producer: tile 0 converted, from entry", ENTRY, P_T0),
    ("wg0: Q here, from entry", ENTRY, Q_READY),
    ("wg0: tile 0 ready, from entry", ENTRY, T0_READY),
    ("wg0: tile 0 QK", T0_READY, T0_QK),
    ("wg0: tile 0 softmax + PV", T0_QK, T0_PV),
    ("wg0: tile 0 ready -> loop done", T0_READY, LOOP),
    ("wg0: epilogue (rows written)", LOOP, WRITTEN),
    ("wg0: final cluster barrier", WRITTEN, EXIT),
    ("producer: loop done -> exit", P_DONE, P_EXIT),
    ("wg1: loop done -> rows written", W1_DONE, W1_WRITTEN),
    ("wg0: entry -> exit", ENTRY, EXIT),
]


def main() -> int:
    ap = timeline_args(__doc__, shapes="v32:64:128,v4-csa:64:128", reps=10)
    ap.add_argument("--topk", default="512,2048")
    ap.add_argument("--no-flush", action="store_true",
                    help="no L2 eviction between launches (inputs and the kernel's code stay in L2)")
    ap.add_argument("--prime", action="store_true",
                    help="after the flush, the same kernel on other inputs of the shape first: its code warm, the data "
                         "cold (ab_fatbins.py --cache primed)")
    args = ap.parse_args()

    gen, timer, mla, env = probe_setup(args.fatbin)
    pools: dict = {}
    primer_pools: dict = {}
    rows = []
    for spec in args.shapes.split(","):
        case, B, h = spec.split(":")
        B, h = int(B), int(h)
        layout = CASES[case][0]
        mla_pool(layout, layout, args.pool_entries, pools, gen)   # mla_batch then takes this cache
        if args.prime:
            mla_pool(layout, layout, args.pool_entries, primer_pools, gen)
        for k in [int(x) for x in args.topk.split(",")]:
            (x,) = mla_batch(case, B, [h], gen, pools, k_main=k)
            name = f"sparse_mla_wg_{'v4' if x.layout == 'v4' else 'v32'}_t64x_tl"
            topk_extra = x.win_ind.shape[-1] if x.win_ind is not None else 0
            plan = mla.make_plan(x.layout, B, h, x.ind.shape[-1], topk_extra, kernel=name,
                                 lossy_bf16_dequant=True)   # V3.2's pair rounds e4m3 x scale (exact on pow2)
            assert plan.splits == 1, plan
            ctas = plan.grid[0] * plan.grid[1] * plan.grid[2]
            stamps = torch.zeros((ctas, WORDS), dtype=torch.int64, device="cuda")
            out = torch.empty((B, 1, h, 512), dtype=torch.bfloat16, device="cuda")
            lse = torch.empty((B, 1, h), dtype=torch.float32, device="cuda")
            extra_kv = x.extra.get("extra_kv", x.kv)
            e3 = x.extra.get("extra_indices", x.ind)
            ref, _ = x.call(mla)()
            if args.prime:
                (y,) = mla_batch(case, B, [h], gen, primer_pools, k_main=k)
                y_stamps = torch.zeros_like(stamps)
                y_out, y_lse = torch.empty_like(out), torch.empty_like(lse)

                def primer():
                    mla.launch(plan, y.q, y.kv, y.ind, y.sm_scale, sinks=y.sinks,
                               extra_kv=y.extra.get("extra_kv", y.kv), e3=y.extra.get("extra_indices", y.ind),
                               out=y_out, lse=y_lse, o_part_ptr=None, lse_part_ptr=y_stamps.data_ptr())
            else:
                primer = None
            per_rep = []
            for _ in range(args.reps):
                stamps.zero_()
                if not args.no_flush:
                    timer.buf.view(torch.int64).sum()
                if primer is not None:
                    primer()
                torch.cuda._sleep(timer.head_start)
                mla.launch(plan, x.q, x.kv, x.ind, x.sm_scale, sinks=x.sinks, extra_kv=extra_kv, e3=e3, out=out,
                           lse=lse, o_part_ptr=None, lse_part_ptr=stamps.data_ptr())
                torch.cuda.synchronize()
                per_rep.append(stamps.cpu())
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            st = torch.stack(per_rep).double()                        # [reps, ctas, 16]
            ghz = clock_ghz(st, ENTRY, EXIT, ENTRY_NS, EXIT_NS)
            res = {"case": case, "B": B, "h": h, "entries": x.n_valid, "tiles": -(-x.n_valid // 64),
                   "ctas": ctas, "rel_err_vs_default": err, "ghz": statistics.median(ghz.flatten().tolist())}
            span = (st[..., EXIT_NS].amax(1) - st[..., ENTRY_NS].amin(1)) / 1e3
            skew = (st[..., ENTRY_NS].amax(1) - st[..., ENTRY_NS].amin(1)) / 1e3
            res["span_us"] = statistics.median(span.tolist())
            res["start_skew_us"] = statistics.median(skew.tolist())
            phases = phases_us(st, PHASES, ghz)
            for label, slot in SUMS:
                phases[f"sum over tiles: {label}"] = median_and_slowest_us(st[..., slot], ghz)
            res["phases_us"] = phases
            rows.append(res)
            print(json.dumps(res), flush=True)
            print(f"\n## {case} B={B} h={h}{', primed' if args.prime else ''}, pool {args.pool_entries} entries, "
                  f"{x.n_valid} entries ({res['tiles']} tiles), {ctas} CTAs, "
                  f"{res['ghz']:.2f} GHz, span {res['span_us']:.1f} us, start skew {res['start_skew_us']:.1f} us, "
                  f"rel err vs default {err:.1e}")
            print("| phase | median CTA us | slowest CTA us |\n|---|---|---|")
            for label, (med, mx) in phases.items():
                print(f"| {label} | {med:.2f} | {mx:.2f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
