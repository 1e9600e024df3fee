#!/usr/bin/env bash
# Profiling aid: GPU tests, then ncu per-kernel duration and DRAM throughput on a few shapes.
cd "$(dirname "$0")/../.." || exit 1
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/dsa_out}"
bash kernels/build.sh >/dev/null
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
timeout 240 python3 -m pytest tests/kernels -m gpu -x -q -p no:cacheprovider --confcutdir=tests/kernels 2>&1 | tail -4
timeout 200 ncu --clock-control none -k regex:dsa_ \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
  python3 kernels/tuning/profile_once.py "${SHAPES:-1x131072,128x131072,64x32768}" > "$OUT/ncu.txt" 2>&1
grep -E "dsa_|gpu__time|dram__|lts__|done" "$OUT/ncu.txt" | sed 's/  */ /g'
if [[ -n "${NCU_SELECT:-}" ]]; then
  timeout 150 ncu --clock-control none -k regex:dsa_select --launch-skip 2 --launch-count 1 --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats \
    python3 kernels/tuning/profile_once.py "128x131072" > "$OUT/ncu_select.txt" 2>&1
  grep -vE "^\s*$|----" "$OUT/ncu_select.txt" | tail -60
fi
