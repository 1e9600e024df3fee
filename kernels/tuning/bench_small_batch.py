#!/usr/bin/env python3
"""DSA indexer, split path: the base kernels against the small-batch ("early") kernels, on the same inputs.

Same method as bench_dsa_indexer.py (harness.Timer: CUDA events, 512 MB L2-evicting read and a device-sleep head
start before every repeat, round-robin, median of --reps), k=2048, max_context = L, next_n = 1. Per (B, L), timed
round-robin on one set of inputs:
  old      the base kernels with the base chunk policy (plan_dsa(early=False))
  new      the early kernels with the early chunk policy and the early select (plan_dsa(early=True, cluster=False))
  cluster  new with the cluster select (plan_dsa(cluster=True); rows up to 128K, "-" beyond)
  early@old chunk / old@new chunk   the two changes apart (kernels vs chunk size)
  score old / score new             the scoring grid alone of old and new
then whether each output is an exact top-k of its own scores and whether new and cluster chose the same set as
old (the scores are bit-identical; sets may differ only among scores equal to the k-th). Floor = B x L x 132 B / the
copy bandwidth measured at the start. Prints one table; --json writes the rows and the environment.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))

import torch
from harness import (
    Timer,
    copy_bandwidth,
    finish,
    indexer_pool,
    indexer_requests,
    random_pages,
    run_env,
    seeded_generator,
    table_head,
)

from pdserve_kernels.dsa_indexer import (
    CLUSTER_MAX,
    CLUSTER_SUBS,
    PAGE,
    SELECT_CHUNK,
    DsaIndexer,
    default_chunk_pages,
    early_chunk_pages,
)

TOPK = 2048
VARIANTS = ("old", "new", "cluster", "early_old_chunk", "old_new_chunk", "score_old", "score_new")
CLUSTER_MAX_LEN = CLUSTER_MAX * CLUSTER_SUBS * SELECT_CHUNK
KWARGS = {"old": {"early": False}, "new": {"early": True, "cluster": False},
          "cluster": {"early": True, "cluster": True}}


def exact_and_same(ind, args, L, variants):
    """Per variant: (exact, same set as old): its output against a top-k of its own scores, then against old's."""
    outs = {}
    for v in variants:
        out, sc = ind(*args, TOPK, max_len=L, return_scores=True, path="split", **KWARGS[v])
        s = sc[:, :L]
        kth = torch.topk(s, TOPK, dim=1).values[:, -1:]
        picked = torch.gather(s, 1, out.long())
        distinct = bool((torch.sort(out, dim=1).values.diff(dim=1) > 0).all())
        outs[v] = (bool((picked >= kth).all()) and distinct, out, s, kth)
    _, o0, s0, kth = outs["old"]

    def above(o, s):   # the chosen positions whose score is above the k-th (the part no tie rule may change)
        return torch.sort(torch.where(torch.gather(s, 1, o.long()) > kth, o, -1), dim=1).values

    return {v: (ok, bool(torch.equal(s0, s)) and bool(torch.equal(above(o0, s0), above(o, s))))
            for v, (ok, o, s, _) in outs.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--lengths", default="8192,32768,131072")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-cluster", action="store_true", help="leave out the cluster select")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.reps < 30:
        ap.error("--reps must be >= 30 (medians of fewer repeats move by more than the differences looked for)")
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    gen = seeded_generator()
    timer = Timer()
    ind = DsaIndexer()
    tiny = torch.ones(1, device="cuda")
    env = run_env(copy_gbs=round(copy_bandwidth(timer), 1),
                  empty_us=round(timer.median_us(lambda: tiny.add_(1), 50), 2))
    print(env, flush=True)
    pool_blocks = max(batches) * max(lengths) // PAGE
    kv = indexer_pool(pool_blocks, gen)
    rows = []
    for L in lengths:
        for B in batches:
            q, w, ctx, bt = indexer_requests(B, L, gen, random_pages(pool_blocks, B, L, gen))
            a = (q, w, kv, ctx, bt.contiguous())
            c_old, c_new = default_chunk_pages(B, L, ind.num_sms), early_chunk_pages(B, L, ind.num_sms)

            def call(early, chunk, select=True, cluster=False):
                return lambda: ind(*a, TOPK, max_len=L, path="split", early=early, cluster=cluster, chunk_pages=chunk,
                                   _select=select)

            with_cluster = L <= CLUSTER_MAX_LEN and not args.no_cluster
            fns = {"old": call(False, c_old), "new": call(True, c_new), "early_old_chunk": call(True, c_old),
                   "old_new_chunk": call(False, c_new), "score_old": call(False, c_old, False),
                   "score_new": call(True, c_new, False)}
            if with_cluster:
                fns["cluster"] = call(True, c_new, cluster=True)
            times = dict(zip(fns, timer.medians_us(list(fns.values()), args.reps), strict=False))
            checks = exact_and_same(ind, a, L, ["old", "new"] + (["cluster"] if with_cluster else []))
            floor = B * L * 132 / (env["copy_gbs"] * 1e3)
            row = dict(B=B, L=L, chunk_old=c_old, chunk_new=c_new, floor_us=round(floor, 2),
                       **{f"{v}_us": round(times[v], 2) if v in times else None for v in VARIANTS},
                       **{f"exact_{v}": ok for v, (ok, _) in checks.items()},
                       **{f"same_{v}": same for v, (_, same) in checks.items() if v != "old"})
            row["speedup"] = round(row["old_us"] / row["new_us"], 3)
            rows.append(row)
            print(row, flush=True)
    return finish(env, rows, args.json, print_table)


def print_table(env: dict, rows: list) -> None:
    table_head(env, f" | copy {env['copy_gbs']} GB/s | empty kernel {env['empty_us']} us",
               "| B | L | old us (chunk) | new us (chunk) | old / new | cluster us | early kernels, old chunk | "
               "old kernels, new chunk | score old | score new | floor us | exact old/new/cluster | "
               "same set new/cluster |")

    def yes(r, key):
        return "-" if r.get(key) is None else ("yes" if r[key] else "NO")

    for r in rows:
        cl = "-" if r["cluster_us"] is None else f"{r['cluster_us']:.1f}"
        print(f"| {r['B']} | {r['L'] // 1024}K | {r['old_us']:.1f} ({r['chunk_old']}) | {r['new_us']:.1f} "
              f"({r['chunk_new']}) | {r['speedup']:.2f}x | {cl} | {r['early_old_chunk_us']:.1f} | "
              f"{r['old_new_chunk_us']:.1f} | {r['score_old_us']:.1f} | {r['score_new_us']:.1f} | "
              f"{r['floor_us']:.1f} | "
              f"{yes(r, 'exact_old')}/{yes(r, 'exact_new')}/{yes(r, 'exact_cluster')} | "
              f"{yes(r, 'same_new')}/{yes(r, 'same_cluster')} |")


if __name__ == "__main__":
    sys.exit(main())
