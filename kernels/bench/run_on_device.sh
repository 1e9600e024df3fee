#!/usr/bin/env bash
# One device call: build (or use the carried build), SASS check, every kernel test (GPU tests and the CPU
# metadata/launcher tests), the variant table and both benchmarks; logs and JSON under $OUT.
# Stages (default all on): BUILD=0 uses kernels/build as carried (a CPU build gives the same bytes: fatbins and
# .json), TESTS=0, VARIANTS=0 (bench_mla_variants.py), BENCH=0 (bench_dsa_indexer.py), MLA_BENCH=0
# (bench_sparse_mla.py), OPS_BENCH=0 (bench_ops.py: the serving ops' call overhead, eager and in a CUDA graph),
# ACCURACY=0 (accuracy_amax448.py: V3.2 on SGLang's amax/448 scales). VARIANT_ARGS / BENCH_ARGS / MLA_BENCH_ARGS pass arguments on (a short smoke run:
# e.g. MLA_BENCH_ARGS="--batches 64 --heads 16,128 --reps 30"). FlashMLA columns fill in when flash_mla is
# importable (PYTHONPATH=.ext/flashmla after building it there; see flashmla_adapter.py).
# TARGETS=1 (default off; last): issue 19's table, bench_targets.py -> $OUT/targets.json + targets.log, with
# its comparators made here first: FlashMLA built from a carried .ext/flashmla (build_flashmla.sh, log in
# $OUT/flashmla_build.log), DeepGEMM installed from a carried .whl/bench (both staged by stage_targets.sh).
# TARGETS_ARGS passes arguments on (--quick: the target rows only); it gets what is left of 560 s.
# Tuning runs (sweeps, probes, ncu) are in kernels/tuning/README.md.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# Each *_ARGS variable is a list of extra arguments to its script, split on spaces.
read -ra variant_args <<< "${VARIANT_ARGS:-}"
read -ra bench_args <<< "${BENCH_ARGS:-}"
read -ra mla_bench_args <<< "${MLA_BENCH_ARGS:-}"
read -ra ops_bench_args <<< "${OPS_BENCH_ARGS:-}"
read -ra accuracy_args <<< "${ACCURACY_ARGS:-}"
read -ra targets_args <<< "${TARGETS_ARGS:-}"
OUT="${OUT:-/tmp/kernels_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
if [[ "${BUILD:-1}" == 1 ]]; then
  bash kernels/build.sh > /dev/null || exit 1   # the bytes that are measured: a plain build (see build.sh)
  # V4's bf16 KV rows (tests and benchmarks) run from the tuning build: the production one is FP8-only for V4
  bash kernels/tuning/build.sh > /dev/null || exit 1
  VERBOSE=1 bash kernels/build.sh /tmp/kernels-verbose 2>&1 | grep -E "Function properties|Used|spill|error|warning|fatbin|json" > "$OUT/build.log"
  grep -cE "Function properties" "$OUT/build.log" | sed 's/^/kernels compiled (both targets): /'
fi
sha256sum kernels/build/*.fatbin kernels/build/*.json | tee "$OUT/sha.txt"
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
export PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode.fatbin"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$PDSERVE_KERNELS_FATBIN" > "$OUT/sass.txt" 2>&1
  echo "indexer QGMMA: $(grep -c QGMMA "$OUT/sass.txt")  HMMA: $(grep -c HMMA "$OUT/sass.txt")  LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass.txt")"
  cuobjdump -sass "$PDSERVE_SPARSE_MLA_FATBIN" > "$OUT/sass_mla.txt" 2>&1
  echo "sparse MLA HMMA: $(grep -c HMMA "$OUT/sass_mla.txt")  HGMMA: $(grep -c HGMMA "$OUT/sass_mla.txt")  LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass_mla.txt")"
fi
if [[ "${TESTS:-1}" == 1 ]]; then
  # --confcutdir: the repository's top conftest imports pdserve, which the GPU machine does not have.
  # The reproducibility test (two full builds) runs in CI, not here.
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/kernels --confcutdir=tests/kernels -q -p no:cacheprovider -rfs \
    --deselect tests/kernels/test_build_reproducible.py::test_fatbin_is_bit_identical_across_build_dirs \
    2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ "${VARIANTS:-1}" == 1 ]]; then
  timeout "${VARIANT_TIMEOUT:-200}" python3 kernels/bench/bench_mla_variants.py --json "$OUT/variants.json" \
    "${variant_args[@]}" 2>&1 | tee "$OUT/variants.log" | grep -v '^{'
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 kernels/bench/bench_dsa_indexer.py --json "$OUT/bench.json" "${bench_args[@]}" \
    2>&1 | tee "$OUT/bench.log" | grep -v '^{'
fi
if [[ "${MLA_BENCH:-1}" == 1 ]]; then
  timeout "${MLA_BENCH_TIMEOUT:-300}" python3 kernels/bench/bench_sparse_mla.py --json "$OUT/mla_bench.json" \
    "${mla_bench_args[@]}" 2>&1 | tee "$OUT/mla_bench.log" | grep -v '^{' | tail -60
fi
if [[ "${OPS_BENCH:-1}" == 1 ]]; then
  timeout "${OPS_BENCH_TIMEOUT:-120}" python3 kernels/bench/bench_ops.py --json "$OUT/ops_bench.json" "${ops_bench_args[@]}" \
    2>&1 | tee "$OUT/ops_bench.log" | grep -v '^{'
fi
if [[ "${ACCURACY:-1}" == 1 ]]; then
  timeout "${ACCURACY_TIMEOUT:-200}" python3 kernels/bench/accuracy_amax448.py --json "$OUT/accuracy.json" \
    "${accuracy_args[@]}" 2>&1 | tee "$OUT/accuracy.log" | grep -v '^{'
fi
if [[ "${TARGETS:-0}" == 1 ]]; then
  t0=$SECONDS
  pypath=${PYTHONPATH:-}
  if compgen -G ".ext/flashmla/flash_mla/cuda*.so" >/dev/null; then
    # Built by an earlier call on this image and carried back in (FLASHMLA_KEEP=1 returns it in $OUT).
    echo "FlashMLA: the carried build $(ls .ext/flashmla/flash_mla/cuda*.so)"
    pypath="$PWD/.ext/flashmla${pypath:+:$pypath}"
  elif [ -f .ext/flashmla/setup.py ]; then
    FLASHMLA_BUILD_LOG="$OUT/flashmla_build.log" bash kernels/bench/build_flashmla.sh && pypath="$PWD/.ext/flashmla${pypath:+:$pypath}"
    [[ "${FLASHMLA_KEEP:-0}" == 1 ]] && cp .ext/flashmla/flash_mla/cuda*.so "$OUT/"
  else
    echo "no .ext/flashmla carried: no FlashMLA column"
  fi
  t1=$SECONDS
  site=/tmp/pdserve-bench-site
  libpath=${LD_LIBRARY_PATH:-}
  if compgen -G ".whl/bench/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/bench/*.whl \
      && pypath="$site${pypath:+:$pypath}"
    # As the DSA tier (tests/gpu/dsa/run_on_device.sh): DeepGEMM's prebuilt _C.so finds tvm-ffi, the image's
    # CUDA 13 libraries and torch's through these.
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    nvidia_libs=$(python3 -c 'import glob, os, torch; base = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))))')
    libpath="$nvidia_libs:$torch_lib:$site/tvm_ffi/lib${libpath:+:$libpath}"
  else
    echo "no .whl/bench carried: no DeepGEMM column"
  fi
  echo "[time] FlashMLA build $((t1 - t0)) s, wheel install $((SECONDS - t1)) s"
  left=$((560 - SECONDS)); [ "$left" -gt 60 ] || left=60
  # DeepGEMM's JIT finds the toolkit from CUDA_HOME, else from the nvcc on PATH (which may be a wrapper);
  # an empty CUDA_HOME counts as unset.
  cuda_home=${CUDA_HOME:-$([ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda)}
  PYTHONPATH="$pypath" LD_LIBRARY_PATH="$libpath" DG_JIT_CACHE_DIR=/tmp/pdserve-deep-gemm-jit CUDA_HOME="$cuda_home" \
    timeout "${TARGETS_TIMEOUT:-$left}" python3 kernels/bench/bench_targets.py --json "$OUT/targets.json" \
    "${targets_args[@]}" 2>&1 | tee "$OUT/targets.log" | grep -v '^{'
  echo "[time] whole call so far $SECONDS s"
fi
