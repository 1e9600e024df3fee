#!/usr/bin/env bash
# One device call: build, SASS check, GPU tests, tuning sweep, benchmark; logs under $OUT.
# Stages are picked with env vars (default all): TESTS=0 SWEEP=0 BENCH=0 to skip; BENCH_ARGS to pass on.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/dsa_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
VERBOSE=1 bash kernels/build.sh 2>&1 | grep -E "Function properties|Used|spill|error|warning|fatbin" | tee "$OUT/build.log"
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$PDSERVE_KERNELS_FATBIN" > "$OUT/sass.txt" 2>&1
  echo "QGMMA: $(grep -c QGMMA "$OUT/sass.txt")  HMMA: $(grep -c HMMA "$OUT/sass.txt")  LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass.txt")"
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests/kernels -m gpu -x -q -p no:cacheprovider --confcutdir=tests/kernels 2>&1 | tee "$OUT/tests.log"
fi
if [[ "${SWEEP:-1}" == 1 ]]; then
  timeout "${SWEEP_TIMEOUT:-120}" python3 kernels/bench/sweep_chunks.py "${SWEEP_IMPLS:-wgmma}" 2>&1 | tee "$OUT/sweep.log"
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 kernels/bench/bench_dsa_indexer.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
