#!/usr/bin/env bash
# Tuning aid: where a 16/32-head ds kernel's time goes (V4 CSA at B=64 by default): its SASS, ncu's warp-state,
# scheduler, occupancy and memory sections, and the per-instruction stall samples (ncu_top_sass.py), then the
# variant table at that shape with the default kernel at several split counts. Results under $OUT.
#   SHAPE=case,B,h,variant (probe_timing.py --ncu)   KERNEL=ncu kernel filter   SPLITS=split counts to time
# shellcheck source=kernels/tuning/device_call.sh disable=SC1091
source "$(dirname "$0")/device_call.sh" /tmp/ds_profile
SHAPE="${SHAPE:-v4-csa,64,16,auto}"
KERNEL="${KERNEL:-regex:sparse_mla_ds_}"
IFS=, read -r case batch heads _ <<<"$SHAPE"
cuobjdump -sass "$PDSERVE_SPARSE_MLA_FATBIN" > "$OUT/sass_mla.txt" 2>&1
ncu --clock-control none -k "$KERNEL" --launch-skip 1 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis python3 kernels/tuning/probe_timing.py --ncu "$SHAPE" > "$OUT/ncu_sections.txt" 2>&1
grep -vE "^\s*$|----" "$OUT/ncu_sections.txt" | grep -E "sparse_mla|Duration|Throughput|Warp Cycles|Eligible|Issued|No Eligible|Active Warps|Occupancy|Registers|Shared Memory Config|Block Limit|Hit Rate|Stall" | head -40
ncu --clock-control none -k "$KERNEL" --launch-skip 1 --launch-count 1 --section SourceCounters --page source \
  --print-source sass --csv python3 kernels/tuning/probe_timing.py --ncu "$SHAPE" > "$OUT/ncu_source.csv" 2>&1
python3 kernels/tuning/ncu_top_sass.py < "$OUT/ncu_source.csv" | tee "$OUT/ncu_top.txt" | head -45
timeout 150 python3 kernels/bench/bench_mla_variants.py --cases "$case" --batches "$batch" --heads "$heads" \
  --splits "${SPLITS:-1,2,4,8}" --reps 30 2>&1 | grep -v '^{' | tail -20
