#!/usr/bin/env bash
# One device call for the es kernels (kernels/build carried): their GPU tests and the ds ones under a short timeout
# (a hang stops the call early), then the 16-head variant table (every ds kernel, the es kernels, the default at
# the split counts in SPLITS) for V4 CSA / HCA and V3.2. Logs under $OUT.
# shellcheck source=kernels/tuning/device_call.sh disable=SC1091
source "$(dirname "$0")/device_call.sh" /tmp/es_out
record_builds kernels/build/*.fatbin
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest tests/kernels/test_sparse_mla_decode_gpu.py --confcutdir=tests/kernels \
  -q -p no:cacheprovider -rfs -x -k "${TESTS_K:-ds_ or default_kernel or combine_batches}" 2>&1 | tee "$OUT/tests.log" | tail -15
timeout "${VARIANT_TIMEOUT:-240}" python3 kernels/bench/bench_mla_variants.py --cases "${CASES:-v4-csa,v4-hca,v32}" \
  --batches "${BATCHES:-1,8,64,128}" --heads 16 --splits "${SPLITS:-}" --reps "${REPS:-30}" --json "$OUT/variants.json" \
  2>&1 | tee "$OUT/variants.log" | grep -v '^{'
