#!/usr/bin/env python3
"""DSA indexer + exact top-2048, several builds on the same inputs: the default call with the fatbin it finds
(PDSERVE_KERNELS_FATBIN or kernels/build: "new") and with each --build label=path (another dsa_indexer build with
its .json beside it; the first is the table's reference), timed round-robin in one process (harness.Timer: L2
evicted before every repeat, median), in the cache states of --cache as ab_fatbins.py has them for sparse MLA:
cold (the benchmark's), primed (L2 evicted, then the same call on another request's keys: code and launch path
warm, the timed call's keys cold; "label@primed") and warm (nothing evicted). Each build's output is checked: an
exact top-k of its own scores, and the same scores as the reference build's.

Tuning aid (kernels/tuning/README.md), not the benchmark.
"""

# The timed closures capture the loop's inputs and are called within the iteration that makes them.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "python")]

import torch  # noqa: E402
from harness import Timer, finish, indexer_pool, indexer_requests, run_env, seeded_generator, table_head  # noqa: E402
from targets import INDEXER_TOPK  # noqa: E402
from targets_measure import is_exact_topk  # noqa: E402

from pdserve_kernels.dsa_indexer import DsaIndexer  # noqa: E402
from pdserve_kernels.reference import PAGE  # noqa: E402

MODES = ("cold", "primed", "warm")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, metavar="LABEL=FATBIN",
                    help="another dsa_indexer build to time beside the default one (repeatable; the first is the "
                         "reference)")
    ap.add_argument("--shapes", default="1:131072,8:131072,1:32768", help="B:L,...")
    ap.add_argument("--cache", default="cold", help="cold, primed, warm: comma-separated cache states")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    modes = args.cache.split(",")
    if not modes or not set(modes) <= set(MODES):
        ap.error(f"--cache {args.cache!r}: a comma-separated list of {', '.join(MODES)}")
    try:
        shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    except ValueError:
        ap.error(f"--shapes {args.shapes!r}: B:L pairs, comma-separated, e.g. 1:131072,8:32768")
    if any(len(s) != 2 or s[0] < 1 or s[1] < PAGE or s[1] % PAGE for s in shapes):
        ap.error(f"--shapes {args.shapes!r}: each B:L needs B >= 1 and L a positive multiple of {PAGE}")

    gen = seeded_generator()
    timer = Timer()
    builds = [tuple(b.split("=", 1)) for b in args.build]
    indexers = [(label, DsaIndexer(fatbin=path)) for label, path in builds] + [("new", DsaIndexer())]
    env = run_env(builds=dict(builds))
    print(json.dumps(env), flush=True)
    # Two requests' worth of pages per shape: the timed call's and the primer's, at distinct random positions.
    kv = indexer_pool(2 * max(B * L for B, L in shapes) // PAGE, gen)
    rows = []
    for B, L in shapes:
        n = B * L // PAGE   # the timed call's pages and the primer's: distinct, at random positions of the pool
        perm = torch.randperm(kv.shape[0], device="cuda", generator=gen)
        x, x2 = indexer_requests(B, L, gen, perm[:n]), indexer_requests(B, L, gen, perm[n:2 * n])
        labels, fns, primers, check = [], [], [], {}
        ref_scores = None
        for label, ind in indexers:
            def call(y=x, ind=ind):
                return ind(y[0], y[1], kv, y[2], y[3], INDEXER_TOPK, max_len=L)
            out, scores = ind(*x[:2], kv, *x[2:], INDEXER_TOPK, max_len=L, return_scores=True)
            ref_scores = scores if ref_scores is None else ref_scores
            check[label] = {"exact": is_exact_topk(out.long(), scores[:, :L]),
                            "same_scores": bool(torch.equal(scores[:, :L], ref_scores[:, :L]))}
            labels.append(label)
            fns.append(call)
            primers.append(lambda y=x2, ind=ind: ind(y[0], y[1], kv, y[2], y[3], INDEXER_TOPK, max_len=L))
        timed = {}
        for mode in modes:
            ts = timer.medians_us(fns, args.reps, primers=primers if mode == "primed" else None,
                                  flush=mode != "warm")
            timed.update({lab if mode == "cold" else f"{lab}@{mode}": round(t, 2)
                          for lab, t in zip(labels, ts, strict=False)})
        row = {"B": B, "L": L, "us": timed, "check": check}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return finish(env, rows, args.json, print_table)


def print_table(env, rows) -> None:
    """One column per build and cache state; ratios against the first build in the same cache state."""
    labels = list(rows[0]["us"]) if rows else []
    refs: dict = {}
    for lab in labels:
        refs.setdefault(lab.partition("@")[2], lab)
    ratios = [lab for lab in labels if refs[lab.partition("@")[2]] != lab]
    table_head(env, "", "| B | L | " + " | ".join(f"{lab} us" for lab in labels)
               + "".join(f" | {lab} / {refs[lab.partition('@')[2]]}" for lab in ratios) + " | checks |")
    for r in rows:
        us = r["us"]
        ok = all(c["exact"] and c["same_scores"] for c in r["check"].values())
        print(f"| {r['B']} | {r['L']} | " + " | ".join(f"{us[lab]:.1f}" for lab in labels)
              + "".join(f" | {us[lab] / us[refs[lab.partition('@')[2]]]:.2f}" for lab in ratios)
              + f" | {'exact, same scores' if ok else json.dumps(r['check'])} |")


if __name__ == "__main__":
    sys.exit(main())
