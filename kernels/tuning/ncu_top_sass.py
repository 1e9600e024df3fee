#!/usr/bin/env python3
"""Tuning aid: read `ncu --section SourceCounters --page source --print-source sass --csv` output (stdin) and
print the warp-stall samples per stall reason, then the SASS instructions with the most samples and their top
three reasons. (How the wg kernels were found producer-bound: NOTES.md, "wg kernels".)"""
import csv
import sys

TOTAL = "Warp Stall Sampling (All Samples)"


def num(x) -> float:
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    lines = [ln for ln in sys.stdin if ln.startswith('"') and not ln.startswith('"Kernel Name"')]
    rows = list(csv.DictReader(lines))
    if not rows or TOTAL not in rows[0]:
        print("no per-instruction rows with stall samples in the input")
        return
    reasons = [k for k in rows[0] if k and k.startswith("stall_") and "Not Issued" not in k]
    total = sum(num(r[TOTAL]) for r in rows) or 1.0
    by_reason = sorted(((sum(num(r[k]) for r in rows), k) for k in reasons), reverse=True)
    print(f"total samples {total:.0f}: " + ", ".join(f"{k[6:]} {v / total:.0%}" for v, k in by_reason[:8]))
    rows.sort(key=lambda r: -num(r[TOTAL]))
    for r in rows[:40]:
        top = sorted(((num(r[k]), k) for k in reasons), reverse=True)[:3]
        print(f"{num(r[TOTAL]) / total * 100:5.1f}%  {r['Address']}  {r['Source'][:72]:72s}  executed "
              f"{r['Instructions Executed']:>8}  " + ", ".join(f"{k[6:]}={v:.0f}" for v, k in top if v))


if __name__ == "__main__":
    main()
