#!/usr/bin/env bash
# One device call for a launcher or kernel change: FlashMLA built (or the carried build used), the kernel GPU
# tests on the new build, then ab_fatbins.py (other builds against the new one, FlashMLA beside them).
#   OUT=$OUT AB_ARGS="--build old=kernels/build/old/sparse_mla_decode.fatbin --shapes v32:64:128 --topk 512,2048" \
#     bash kernels/tuning/run_ab.sh
# carrying kernels/build (other builds' .fatbin and .json in subfolders) and .ext/flashmla/flash_mla (or the whole
# .ext/flashmla for a build there).
# FLASHMLA_KEEP=1 returns FlashMLA's extension in $OUT, to be carried into .ext/flashmla/flash_mla next time.
# shellcheck source=kernels/tuning/device_call.sh disable=SC1091
source "$(dirname "$0")/device_call.sh" /tmp/kernels_out
read -ra ab_args <<< "${AB_ARGS:-}"   # extra arguments to the script, split on spaces
record_builds kernels/build/*.fatbin kernels/build/*/*.fatbin
pypath=${PYTHONPATH:-}
build_pid=""
if compgen -G ".ext/flashmla/flash_mla/cuda*.so" >/dev/null; then
  echo "FlashMLA: the carried build"
elif [ -f .ext/flashmla/setup.py ]; then
  (FLASHMLA_BUILD_LOG="$OUT/flashmla_build.log" bash kernels/bench/build_flashmla.sh > "$OUT/flashmla_build.txt" 2>&1
   [[ "${FLASHMLA_KEEP:-0}" == 1 ]] && cp .ext/flashmla/flash_mla/cuda*.so "$OUT/") &
  build_pid=$!
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/kernels --confcutdir=tests/kernels -q -p no:cacheprovider -rfs \
    --deselect tests/kernels/test_build_reproducible.py::test_fatbin_is_bit_identical_across_build_dirs \
    2>&1 | tee "$OUT/tests.log" | tail -15
fi
[ -n "$build_pid" ] && { wait "$build_pid"; tail -2 "$OUT/flashmla_build.txt"; }
compgen -G ".ext/flashmla/flash_mla/cuda*.so" >/dev/null && pypath="$PWD/.ext/flashmla${pypath:+:$pypath}"
PYTHONPATH="$pypath" timeout "${AB_TIMEOUT:-300}" python3 kernels/tuning/ab_fatbins.py --json "$OUT/ab.json" "${ab_args[@]}" 2>&1 \
  | tee "$OUT/ab.log" | grep -v '^{'
echo "[time] $SECONDS s"
