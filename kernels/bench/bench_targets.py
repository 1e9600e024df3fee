#!/usr/bin/env python3
"""The kernels' benchmark table (issue 19): ours, the best public comparator and the floor, one process, one
table, each issue target met or missed. kernels/BENCHMARKS.md's "Current numbers" table is meant to be this
script's output, rendered from the run's JSON with --markdown-from.

Rows (targets.py): issue 19's target shapes first, then the grids (unless --quick): sparse MLA decode, six cases
(V4-Flash CSA 512 selected + 128 window entries, HCA 1024 + 128, V3.2 top-2048; fp8 and bf16 KV) x B in
{1, 8, 64, 128} x h in {16, 32, 64, 128}; DSA indexer + exact top-2048, B in {1, 8, 32, 64, 128} x L in
{8K, 32K, 128K, 512K} at max_context = L. One query token per request, page 64.

Per row:
- ours: the launchers' default choice (SparseMlaDecode / DsaIndexer with no kernel arguments; sparse MLA exact on any
  fp32 scale, or with --lossy the faster lossy opt-in, lossy_bf16_dequant=True: the env says which), median of --reps
  (>= 30) CUDA-event timings, L2 evicted before every repeat, ~100 us device head start (harness.Timer), timed
  round-robin with the comparator on the same inputs; the bf16 V4 cases from the tuning fatbin beside the production
  one (harness.MlaLaunchers; "(tuning fatbin)" in the default's cell), as the production build, FP8-only for V4
  because SGLang's V4 cache is, has no bf16 V4 kernels;
- comparator: FlashMLA 9241ae3e's sparse decode for the fp8 cases (flashmla_adapter.py; below 64 heads q is
  zero-padded to 64, as a TP caller would do), DeepGEMM fp8_paged_mqa_logits + mask + torch.topk for the
  indexer (deepgemm_adapter.py); none for the bf16 cases;
- floor: sparse MLA max(unique bytes / copy bandwidth, useful FLOPs / bf16 matmul rate), indexer
  B x L x 132 B / copy bandwidth, both ceilings measured at the start of this run (harness);
- check of ours: sparse MLA relative L2 against the fp32 reference on every row <= 5e-3 and max |lse error|
  <= 1e-3 (the GPU tests' bounds); indexer: our set is a top-k of our own fp32 scores (distinct, in range,
  none below the k-th), our scores within 1e-3 relative L2 of the fp32 reference (row 0) and of DeepGEMM's
  logits (every row). A row that fails its check misses its target whatever its time.

Modes: --dry-run lists the rows (no GPU); --json PATH writes the env and every row (rewritten after each row,
so a run cut short keeps what it measured); --markdown-from PATH prints the table of a saved run (no GPU,
no torch). On the GPU machine: TARGETS=1 bash kernels/bench/run_on_device.sh (it builds FlashMLA and
installs DeepGEMM first; stage_targets.sh stages both here). The rows, the targets and the markdown are in
targets.py, the measuring in targets_measure.py.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from targets import GRIDS, plan, render_markdown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the target rows only")
    ap.add_argument("--grids", default=",".join(GRIDS), help="grids after the targets (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None, help="write the env and every measured row here")
    ap.add_argument("--markdown-from", default=None, metavar="JSON", help="print the table of a saved run")
    ap.add_argument("--dry-run", action="store_true", help="list the rows that would be timed, then stop")
    ap.add_argument("--lossy", action="store_true",
                    help="sparse MLA with lossy_bf16_dequant=True (V3.2 e4m3 x scale rounded to bf16; these inputs' "
                         "scales are powers of two, where that is exact too)")
    args = ap.parse_args()
    if args.markdown_from:
        saved = json.loads(pathlib.Path(args.markdown_from).read_text())
        print(render_markdown(saved["env"], saved["rows"]))
        return 0
    rows = plan(() if args.quick else [g for g in args.grids.split(",") if g])
    if args.dry_run:
        print_plan(rows)
        return 0
    assert args.reps >= 30, "the benchmark contract is >= 30 repeats"
    from targets_measure import Bench  # torch, the launchers and the comparators: only to measure
    return Bench(args.reps, rows, lossy_bf16_dequant=args.lossy).run(args.json)


def print_plan(rows: list[dict]) -> None:
    for r in rows:
        size = f"h={r['h']}" if r["kernel"] == "sparse_mla" else f"L={r['L']}"
        print(f"{r['kernel']:<12} {r['case']:<12} B={r['B']:<4} {size:<9} {r.get('target', {}).get('text', '')}")
    n_mla = sum(r["kernel"] == "sparse_mla" for r in rows)
    print(f"{len(rows)} rows: {n_mla} sparse MLA, {len(rows) - n_mla} indexer, "
          f"{sum('target' in r for r in rows)} with a target")


if __name__ == "__main__":
    sys.exit(main())
