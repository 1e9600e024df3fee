#!/usr/bin/env bash
# Tuning aid: the in-kernel duration of each launch of one call (ncu's gpu__time_duration, caches flushed before
# every kernel as ncu does by default, clocks as the benchmark runs them), for shapes given as
# "case,B,h,variant-or-kernel" arguments: what a call's kernels cost apart from the launch and the timer (the
# benchmark's ~3.3 us for an empty kernel, kernels/tuning/probe_handoff.cu). The second call of each shape is
# profiled (the first warms up). FATBIN overrides the production fatbin (e.g. the tuning build).
#   bash kernels/tuning/ncu_durations.sh v4-csa,1,16,auto v4-csa,1,16,sparse_mla_ds_v4_h16_t32_s4
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export PYTHONUNBUFFERED=1
export PDSERVE_SPARSE_MLA_FATBIN="${FATBIN:-$PWD/kernels/build/sparse_mla_decode.fatbin}"
echo "| shape | kernel | grid | us |"
echo "|---|---|---|---|"
for shape in "$@"; do
  ncu --clock-control none --metrics gpu__time_duration.sum -k regex:sparse_mla --launch-skip 2 --launch-count 2 \
    --csv python3 kernels/tuning/probe_timing.py --ncu "$shape" 2>/dev/null |
    python3 -c '
import csv, sys
shape = sys.argv[1]
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith("\"")) ]
head, body = rows[0], rows[1:]
k, g, v, u = head.index("Kernel Name"), head.index("Grid Size"), head.index("Metric Value"), head.index("Metric Unit")
for r in body:
    us = float(r[v].replace(",", "")) * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r[u]]
    print(f"| {shape} | {r[k]} | {r[g]} | {us:.2f} |")
' "$shape"
done
