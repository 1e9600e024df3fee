#!/usr/bin/env bash
# One device call for the experimental wgt kernels (kernels/NOTES.md, "wgt kernels"; tuning build only): their
# GPU tests, the probes' medians (which side bounds a 64-entry tile), the same with a small KV pool (what the
# gathers' TLB misses cost) and the variant table with the wgt kernels beside the defaults; logs and JSON under
# $OUT. Uses kernels/build as carried, with both builds made on the CPU first:
#   bash kernels/build.sh && bash kernels/tuning/build.sh
# The wgt tests run first under a short timeout: a new producer pipeline could hang on a named barrier, and if
# it does the timing stages are skipped (they would hang too).
# shellcheck source=kernels/tuning/device_call.sh disable=SC1091
source "$(dirname "$0")/device_call.sh" /tmp/kernels_out
read -ra variant_args <<< "${VARIANT_ARGS:---cases v4-csa,v32 --batches 8,64 --heads 16,64,128 --reps 30}"   # extra arguments to the script, split on spaces
record_gpu
record_builds kernels/build/*.fatbin kernels/build/*.json
[ -f kernels/build/sparse_mla_decode_tuning.fatbin ] || { echo "no tuning build carried: bash kernels/tuning/build.sh"; exit 1; }
# --confcutdir: the repository's top conftest imports pdserve, which the GPU machine does not have.
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest --confcutdir=tests/kernels -q -p no:cacheprovider -rfs \
  tests/kernels/test_sparse_mla_decode_gpu.py -k "wgt or test_wg_v32_top2048" 2>&1 | tee "$OUT/tests_wgt.log" | tail -8
if [[ ${PIPESTATUS[0]} == 124 ]]; then
  echo "wgt tests timed out (a hang): no timing"
  exit 1
fi
timeout "${PROBE_TIMEOUT:-150}" python3 kernels/tuning/probe_wg.py --time 2>&1 | tee "$OUT/probe_wg.log"
timeout "${PROBE_TIMEOUT:-150}" python3 kernels/tuning/probe_wg.py --time --pool 16384 2>&1 | tee "$OUT/probe_wg_pool16k.log"
PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode_tuning.fatbin" \
  timeout "${VARIANT_TIMEOUT:-200}" python3 kernels/bench/bench_mla_variants.py --json "$OUT/variants.json" \
  "${variant_args[@]}" 2>&1 | tee "$OUT/variants.log" | grep -v '^{'
