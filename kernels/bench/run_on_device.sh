#!/usr/bin/env bash
# One device call: build, SASS check, GPU tests, tuning sweep, benchmarks; logs under $OUT.
# Stages are picked with env vars (default all): BUILD=0 (use fatbins already in kernels/build, e.g.
# carried from a CPU build: the bytes are identical), TESTS=0 SWEEP=0 PATHS=0 BENCH=0 for the indexer
# (PATHS: bench_paths.py, split vs fused single launch),
# MLA_TESTS=0 MLA_BENCH=0 for sparse MLA decode; BENCH_ARGS / MLA_BENCH_ARGS to pass on.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/dsa_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
if [[ "${BUILD:-1}" == 1 ]]; then
  VERBOSE=1 bash kernels/build.sh 2>&1 | grep -E "Function properties|Used|spill|error|warning|fatbin" | tee "$OUT/build.log"
fi
sha256sum kernels/build/*.fatbin | tee -a "$OUT/build.log"
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
export PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode.fatbin"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$PDSERVE_KERNELS_FATBIN" > "$OUT/sass.txt" 2>&1
  echo "indexer QGMMA: $(grep -c QGMMA "$OUT/sass.txt")  HMMA: $(grep -c HMMA "$OUT/sass.txt")  LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass.txt")"
  cuobjdump -sass "$PDSERVE_SPARSE_MLA_FATBIN" > "$OUT/sass_mla.txt" 2>&1
  echo "sparse MLA HMMA: $(grep -c HMMA "$OUT/sass_mla.txt")  LDSM: $(grep -c LDSM "$OUT/sass_mla.txt")  LDGSTS: $(grep -c LDGSTS "$OUT/sass_mla.txt")  LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass_mla.txt")"
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests/kernels/test_dsa_indexer_gpu.py -m gpu -x -q -p no:cacheprovider --confcutdir=tests/kernels 2>&1 | tee "$OUT/tests.log"
fi
if [[ "${MLA_TESTS:-1}" == 1 ]]; then
  timeout "${MLA_TEST_TIMEOUT:-240}" python3 -m pytest tests/kernels/test_sparse_mla_decode_gpu.py -m gpu -q -p no:cacheprovider --confcutdir=tests/kernels -rf 2>&1 | tee "$OUT/mla_tests.log"
fi
if [[ "${SWEEP:-1}" == 1 ]]; then
  timeout "${SWEEP_TIMEOUT:-120}" python3 kernels/bench/sweep_chunks.py "${SWEEP_IMPLS:-wgmma}" 2>&1 | tee "$OUT/sweep.log"
fi
if [[ "${PATHS:-1}" == 1 ]]; then
  timeout "${PATHS_TIMEOUT:-240}" python3 kernels/bench/bench_paths.py --json "$OUT/paths.json" ${PATHS_ARGS:-} 2>&1 | tee "$OUT/paths.log"
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 kernels/bench/bench_dsa_indexer.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
if [[ "${MLA_NCU:-0}" == 1 ]] && command -v ncu >/dev/null; then
  timeout "${MLA_NCU_TIMEOUT:-120}" ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis -k regex:sparse_mla_v4 \
    python3 kernels/bench/profile_mla.py > "$OUT/ncu_mla.txt" 2>&1
  grep -E "sparse_mla|Duration|Throughput|Stall|Warp Cycles|Issued Ipc|Achieved Occupancy|One or More|No Eligible" "$OUT/ncu_mla.txt" | head -60
fi
if [[ "${MLA_BENCH:-1}" == 1 ]]; then
  timeout "${MLA_BENCH_TIMEOUT:-300}" python3 kernels/bench/bench_sparse_mla.py --json "$OUT/mla_bench.json" ${MLA_BENCH_ARGS:-} 2>&1 | tee "$OUT/mla_bench.log"
fi
