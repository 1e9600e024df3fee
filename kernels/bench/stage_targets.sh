#!/usr/bin/env bash
# Stages, on the CPU machine, what `TARGETS=1 bash kernels/bench/run_on_device.sh` carries to the GPU machine
# besides kernels/build (all git-ignored, never committed):
#   .whl/bench/     DeepGEMM for Python 3.12: sgl-deep-gemm (the DSA tier's pin, tests/gpu/wheelhouse.py) and
#                   the one requirement the GPU image lacks, apache-tvm-ffi (wheelhouse.txt's pin; its own
#                   requirement typing-extensions is in the image);
#   .ext/flashmla/  with two arguments, FlashMLA 9241ae3e's setup.py, python package and csrc, and CUTLASS
#                   147f5673's include/ and tools/util/include/ as its csrc/cutlass: what build_flashmla.sh needs.
# Usage: bash kernels/bench/stage_targets.sh [FLASHMLA_GIT_DIR CUTLASS_GIT_DIR]   (bare clones holding both
# commits, e.g. the search tool's fetch of deepseek-ai/FlashMLA and NVIDIA/cutlass). Ends with the sizes of the
# carry set (64 MiB at most per device call, the working tree included).
set -euo pipefail
cd "$(dirname "$0")/../.."
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
CUTLASS_COMMIT=147f5673d0c1c3dcf66f78d677fd647e4a020219

dg_pin=$(python3 -c 'import sys; sys.path.insert(0, "tests/gpu"); from wheelhouse import DSA_EXTRA_PINS as p
print(*[x for x in p if x.startswith("sgl_deep_gemm==")])')
tvm_pin=$(grep -i '^apache_tvm_ffi==' tests/gpu/wheelhouse.txt)
rm -rf .whl/bench && mkdir -p .whl/bench
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl/bench "$dg_pin" "$tvm_pin"
# The pins must agree with what sgl-deep-gemm itself requires.
need=$(unzip -p .whl/bench/sgl_deep_gemm-*.whl '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \([^;]*\)$/\1/p')
[ "$(echo "$need" | tr 'A-Z-' 'a-z_')" = "$(echo "$tvm_pin" | tr 'A-Z-' 'a-z_')" ] \
  || { echo "sgl-deep-gemm requires '$need', staged '$tvm_pin'"; exit 1; }
ls -l .whl/bench

if [ $# -eq 2 ]; then
  rm -rf .ext/flashmla && mkdir -p .ext/flashmla/csrc/cutlass
  git --git-dir="$1" archive "$FLASHMLA_COMMIT" setup.py LICENSE flash_mla csrc | tar -x -C .ext/flashmla
  # A mirror without CUTLASS's media blobs prints "invalid object" for them; these paths must arrive whole.
  git --git-dir="$2" archive "$CUTLASS_COMMIT" LICENSE.txt include tools/util/include 2> >(grep -v 'invalid object' >&2) \
    | tar -x -C .ext/flashmla/csrc/cutlass
  want=$(git --git-dir="$2" ls-tree -r "$CUTLASS_COMMIT" include tools/util/include | wc -l)
  have=$(find .ext/flashmla/csrc/cutlass/include .ext/flashmla/csrc/cutlass/tools -type f | wc -l)
  [ "$want" = "$have" ] || { echo "CUTLASS: $have of $want header files staged"; exit 1; }
fi
[ -f .ext/flashmla/setup.py ] || echo "no .ext/flashmla: the run's FlashMLA columns will stay empty"
du -sh kernels/build .whl/bench .ext/flashmla 2>/dev/null
du -cb --apparent-size kernels/build .whl/bench .ext/flashmla 2>/dev/null | tail -1 | awk '{printf "carried: %.1f MiB\n", $1 / 1048576}'
