#!/usr/bin/env bash
# One device call for the DSA indexer's small-batch variants (kernels/NOTES.md, "Small-batch variants"): every
# kernel test, then bench_small_batch.py (base vs early vs cluster on the same inputs); logs and JSON under $OUT.
# Uses kernels/build as carried (bash kernels/build.sh on the CPU gives the same bytes).
# The cluster select's tests run first under a short timeout: they are the only ones that could hang (a cluster
# barrier), and if they do, the rest runs without them (pytest -k "not cluster", bench --no-cluster), so one
# call still gives the early variant's result.
# shellcheck source=kernels/tuning/device_call.sh disable=SC1091
source "$(dirname "$0")/device_call.sh" /tmp/kernels_out
read -ra bench_args <<< "${BENCH_ARGS:-}"   # extra arguments to the script, split on spaces
record_gpu
record_builds kernels/build/*.fatbin kernels/build/*.json
# --confcutdir: the repository's top conftest imports pdserve, which the GPU machine does not have.
PYTEST=(python3 -m pytest --confcutdir=tests/kernels -q -p no:cacheprovider -rfs)
timeout "${CLUSTER_TIMEOUT:-90}" "${PYTEST[@]}" tests/kernels/test_dsa_indexer_gpu.py -k cluster 2>&1 \
  | tee "$OUT/tests_cluster.log" | tail -5
rc=${PIPESTATUS[0]}
select=()
bench=()
if [[ $rc == 124 ]]; then
  echo "cluster tests timed out (a hang): the rest runs without the cluster select"
  select=(-k "not cluster")
  bench=(--no-cluster)
fi
timeout "${TEST_TIMEOUT:-300}" "${PYTEST[@]}" tests/kernels "${select[@]}" \
  --deselect tests/kernels/test_build_reproducible.py::test_fatbin_is_bit_identical_across_build_dirs \
  2>&1 | tee "$OUT/tests.log" | tail -25
timeout "${BENCH_TIMEOUT:-240}" python3 kernels/tuning/bench_small_batch.py --json "$OUT/small_batch.json" \
  "${bench[@]}" "${bench_args[@]}" 2>&1 | tee "$OUT/small_batch.log" | grep -v "^{"
