#!/usr/bin/env bash
# One device call for the wg kernels (sm_90a): fatbins carried from a CPU build (kernels/build.sh), the
# descriptor probe (probe_wg.py), the wg GPU tests, then the wg-vs-default table (bench_wg.py); logs under
# $OUT. Stages: PROBE=0 TESTS=0 BENCH=0 skip one; TEST_SEL (pytest -k, default "wg"), BENCH_ARGS pass on.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/wg_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/kernels/python"
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
export PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode.fatbin"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
sha256sum kernels/build/*.fatbin | tee "$OUT/sha.txt"
if [[ "${PROBE:-1}" == 1 ]]; then
  timeout "${PROBE_TIMEOUT:-60}" python3 kernels/bench/probe_wg.py 2>&1 | tee "$OUT/probe.log"
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu --confcutdir=tests/kernels -q -p no:cacheprovider -rf \
    tests/kernels -k "${TEST_SEL:-wg}" 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout "${BENCH_TIMEOUT:-200}" python3 kernels/bench/bench_wg.py --json "$OUT/wg_bench.json" ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/wg_bench.log" | grep -v '^{' | tail -40
fi
