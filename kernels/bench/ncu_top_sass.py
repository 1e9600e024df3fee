#!/usr/bin/env python3
"""Tuning aid: read `ncu --page source --print-source sass --csv` output (stdin) and print the SASS
instructions with the most warp-stall samples, with their top stall reasons."""
import csv
import sys


def main() -> None:
    lines = [ln for ln in sys.stdin if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        print("no rows")
        return
    keys = list(rows[0])
    total_key = next((k for k in keys if "Warp Stall Sampling (All Samples)" in k and "Not" not in k), None)
    stall_keys = [k for k in keys if k.startswith("stall_") or "Stall" in k and k != total_key]

    def num(x):
        try:
            return float(str(x).replace(",", ""))
        except ValueError:
            return 0.0

    rows.sort(key=lambda r: -num(r.get(total_key, 0)))
    tot = sum(num(r.get(total_key, 0)) for r in rows)
    print(f"total samples {tot:.0f}; columns: {total_key}")
    for r in rows[:45]:
        reasons = sorted(((num(r[k]), k) for k in stall_keys), reverse=True)[:3]
        src = r.get("Source", "")[:70]
        print(f"{num(r.get(total_key, 0)) / max(tot, 1) * 100:5.1f}%  {r.get('Address', '')}  {src:70s}  "
              + ", ".join(f"{k}={v:.0f}" for v, k in reasons if v))


if __name__ == "__main__":
    main()
