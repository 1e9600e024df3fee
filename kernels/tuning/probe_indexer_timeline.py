#!/usr/bin/env python3
"""Where a DSA indexer call's time goes at small batch: the tuning build of dsa_indexer (kernels/tuning/build.sh,
PDSERVE_TUNING_PROBES) has thread 0 of every scoring and select CTA write the global timer at its phases into the
module's `dsa_timeline` array (tl_stamp in dsa_indexer/common.cuh). Per shape (B:L), over --reps calls each after an L2
flush and a sleep (as harness.Timer), timed by CUDA events around the call as the benchmark does, it prints the
medians of:
  * the call as the events read it, and the spans inside it, in us from the first scoring CTA's entry: the scoring
    CTAs' last entry and last end, the select CTAs' first entry, past griddepcontrol.wait, and each select phase's
    last CTA (threshold bin found, scores classified, slots reserved, outputs written), then the resolving CTA's
    phases (candidates in, the two radix rounds, done); what the events read beyond the first entry to the last
    stamp is launch and event overhead;
  * the scoring CTAs' phases (lengths landed, first page, last page, scores stored, histogram flushed), the median
    CTA and the slowest;
  * the tied candidates the resolve sorted.
Every call's output is checked against the production build's (same set, same scores).

Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import torch  # noqa: E402
from ab_indexer import requests  # noqa: E402
from harness import Timer, env_head, indexer_pool, run_env, seeded_generator  # noqa: E402
from targets import INDEXER_TOPK  # noqa: E402

from pdserve_kernels.dsa_indexer import DsaIndexer  # noqa: E402
from pdserve_kernels.reference import PAGE  # noqa: E402

# dsa_timeline's layout (dsa_indexer/common.cuh, tl_word): scoring CTAs first, then select CTAs; slots per CTA.
SCORE_CTAS, SCORE_SLOTS, SELECT_CTAS, SELECT_SLOTS = 4096, 8, 256, 16
(S_ENTRY, S_LENGTHS, S_PAGE0, S_LAST_PAGE, S_STORED, S_FLUSHED, S_ALL_STORED) = range(7)
(T_ENTRY, T_WAITED, T_THRESHOLD, T_CLASSIFIED, T_RESERVED, T_WRITTEN, T_CLUSTER, T_RESOLVE, T_DONE, T_ROUND1,
 T_ROUND2, T_SCORES) = range(12)
T_TIES = 15
SCORE_PHASES = [  # (label, from slot, to slot) of one scoring CTA
    ("entry -> lengths landed (block ids, head weights with them)", S_ENTRY, S_LENGTHS),
    ("-> first page landed", S_LENGTHS, S_PAGE0),
    ("-> last page landed", S_PAGE0, S_LAST_PAGE),
    ("-> last page's scores stored (warp 0)", S_LAST_PAGE, S_STORED),
    ("-> every warp's (the barrier)", S_STORED, S_ALL_STORED),
    ("-> histogram's atomics issued", S_ALL_STORED, S_FLUSHED),
    ("entry -> end", S_ENTRY, S_FLUSHED),
]


def read_timeline(indexer: DsaIndexer) -> tuple[list, list]:
    """(scoring CTAs' slots, select CTAs' slots) of the CTAs that stamped, each a list of per-CTA lists."""
    raw = indexer.module.read_global("dsa_timeline")
    if len(raw) != 8 * (SCORE_CTAS * SCORE_SLOTS + SELECT_CTAS * SELECT_SLOTS):
        raise SystemExit(f"dsa_timeline is {len(raw)} bytes, not this probe's layout: rebuild the tuning fatbin")
    words = struct.unpack(f"<{len(raw) // 8}Q", raw)
    score = [words[c * SCORE_SLOTS:(c + 1) * SCORE_SLOTS] for c in range(SCORE_CTAS)]
    base = SCORE_CTAS * SCORE_SLOTS
    select = [words[base + c * SELECT_SLOTS:base + (c + 1) * SELECT_SLOTS] for c in range(SELECT_CTAS)]
    return [s for s in score if s[S_ENTRY]], [s for s in select if s[T_ENTRY]]


def spans(score: list, select: list, events_us: float) -> dict:
    """One call's spans in us from the first scoring CTA's entry (None where no CTA stamped that phase)."""
    t0 = min(s[S_ENTRY] for s in score)
    us = lambda t: (t - t0) / 1e3  # noqa: E731
    working = [s for s in score if s[S_FLUSHED]]   # CTAs with pages to score (the others leave after the lengths)
    resolver = [s for s in select if s[T_DONE]]
    out = {"events": events_us, "score CTAs with pages": len(working),
           "last scoring CTA entered": us(max(s[S_ENTRY] for s in score)),
           "last scoring CTA's histogram issued": us(max(s[S_FLUSHED] for s in working)),
           "first select CTA entered": us(min(s[T_ENTRY] for s in select)),
           "first select CTA past its wait": us(min(s[T_WAITED] for s in select)),
           "last select CTA past its wait": us(max(s[T_WAITED] for s in select))}
    for label, slot in (("first sub-chunk of scores landed", T_SCORES), ("threshold bin found", T_THRESHOLD),
                        ("scores classified", T_CLASSIFIED),
                        ("slots reserved", T_RESERVED), ("outputs written", T_WRITTEN)):
        stamped = [s[slot] for s in select if s[slot]]
        if stamped:
            out[f"last select CTA: {label}"] = us(max(stamped))
    if resolver:
        r = resolver[0]
        for label, slot in (("resolver: cluster barrier passed", T_CLUSTER), ("resolver: candidates in", T_RESOLVE),
                            ("resolver: round 1", T_ROUND1), ("resolver: round 2", T_ROUND2),
                            ("resolver: done", T_DONE)):
            out[label] = us(r[slot]) if r[slot] else None
        out["tied candidates"] = r[T_TIES]
    for label, a, b in SCORE_PHASES:
        d = sorted((s[b] - s[a]) / 1e3 for s in working)
        out[f"scoring CTA {label} (median)"] = statistics.median(d)
        out[f"scoring CTA {label} (slowest)"] = d[-1]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fatbin", default=str(ROOT / "build" / "dsa_indexer_tuning.fatbin"))
    ap.add_argument("--shapes", default="1:131072,1:32768")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]

    env = run_env(fatbin=args.fatbin)
    print(json.dumps(env), flush=True)
    gen, timer = seeded_generator(), Timer()
    probe, production = DsaIndexer(fatbin=args.fatbin), DsaIndexer()
    kv = indexer_pool(max(B * L for B, L in shapes) // PAGE, gen)
    rows = []
    for B, L in shapes:
        pages = torch.randperm(kv.shape[0], device="cuda", generator=gen)[:B * L // PAGE]
        x = requests(B, L, gen, pages)
        call = lambda ind: ind(x[0], x[1], kv, x[2], x[3], INDEXER_TOPK, max_len=L, return_scores=True)  # noqa: E731
        ref_out, ref_scores = call(production)
        out, scores = call(probe)
        same = bool(torch.equal(scores[:, :L], ref_scores[:, :L])
                    and torch.equal(out.sort(dim=-1).values, ref_out.sort(dim=-1).values))
        per_call = []
        for _ in range(args.reps):
            probe.module.zero_global("dsa_timeline")
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            timer.buf.view(torch.int64).sum()
            torch.cuda._sleep(timer.head_start)
            s.record()
            call(probe)
            e.record()
            torch.cuda.synchronize()
            per_call.append(spans(*read_timeline(probe), s.elapsed_time(e) * 1e3))
        keys = per_call[0].keys()
        med = {k: statistics.median(c[k] for c in per_call if c.get(k) is not None)
               for k in keys if any(c.get(k) is not None for c in per_call)}
        row = {"B": B, "L": L, "same_as_production": same, "medians": med}
        rows.append(row)
        print(json.dumps(row), flush=True)
    env_head(env, f" | {args.reps} calls per shape")
    for r in rows:
        print(f"\n## B={r['B']} L={r['L']} (output {'the same as' if r['same_as_production'] else 'DIFFERENT from'} "
              "the production build's)\n")
        print("| span (us from the first scoring CTA's entry; counts as counts) | median of calls |")
        print("|---|---|")
        for k, v in r["medians"].items():
            print(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0 if all(r["same_as_production"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
