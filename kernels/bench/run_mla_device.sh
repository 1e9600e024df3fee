#!/usr/bin/env bash
# One device call for the sparse MLA decode work: fatbins carried from a CPU build (kernels/build.sh gives
# bit-identical bytes), a short smoke run of the ds kernels, every kernel GPU test, the variant table
# (bench_mla_variants.py) and the decode benchmark; logs under $OUT. Stages: SMOKE=0 TESTS=0 VARIANTS=0
# MLA_BENCH=0 skip one (MLA_BENCH_DS=1: its fp8 rows on the ds kernels); VARIANT_ARGS / MLA_BENCH_ARGS pass arguments on. If the smoke run fails or hangs,
# the ds tests and ds timings are skipped so the rest still reports.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/mla_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
export PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode.fatbin"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
sha256sum kernels/build/*.fatbin | tee "$OUT/sha.txt"
PYTEST=(python3 -m pytest -m gpu --confcutdir=tests/kernels -q -p no:cacheprovider -rf)
ds_ok=1
if [[ "${SMOKE:-1}" == 1 ]]; then
  if ! timeout "${SMOKE_TIMEOUT:-60}" "${PYTEST[@]}" -x tests/kernels/test_sparse_mla_decode_gpu.py \
      -k "test_ds_v4_csa_window_plus_selected or test_ds_v32_top2048" 2>&1 | tee "$OUT/smoke.log" | tail -5; then
    ds_ok=0
    echo "SMOKE FAILED: skipping the ds tests and timings"
  fi
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  sel=()
  [[ $ds_ok == 1 ]] || sel=(-k "not test_ds_")
  timeout "${TEST_TIMEOUT:-200}" "${PYTEST[@]}" tests/kernels "${sel[@]}" 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ "${VARIANTS:-1}" == 1 && $ds_ok == 1 ]]; then
  timeout "${VARIANT_TIMEOUT:-150}" python3 kernels/bench/bench_mla_variants.py --json "$OUT/variants.json" \
    ${VARIANT_ARGS:-} 2>&1 | tee "$OUT/variants.log" | grep -v '^{'
fi
if [[ "${MLA_BENCH:-1}" == 1 ]]; then
  # MLA_BENCH_DS=1: the benchmark's fp8 rows run the ds kernels (launcher variant "ds"), if the smoke run passed.
  [[ "${MLA_BENCH_DS:-0}" == 1 && $ds_ok == 1 ]] && export PDSERVE_SPARSE_MLA_FP8_OPT=ds
  timeout "${MLA_BENCH_TIMEOUT:-150}" python3 kernels/bench/bench_sparse_mla.py --json "$OUT/mla_bench.json" \
    ${MLA_BENCH_ARGS:-} 2>&1 | tee "$OUT/mla_bench.log" | grep -v '^{' | tail -60
fi
