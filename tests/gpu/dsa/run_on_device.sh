#!/usr/bin/env bash
# The DSA comparison on a GPU machine that has torch but no SGLang and no network (the H200 test
# machines), for the tiny DeepSeek-V3.2 or, with --v4 first, the tiny DeepSeek-V4. The wheel chunks of
# `tests/gpu/wheelhouse.py --dsa` (or --v4) arrive one device call at a time:
#   bash tests/gpu/dsa/run_on_device.sh [--v4] stage          # with .whl/<set>/cN carried: keep its wheels
#   bash tests/gpu/dsa/run_on_device.sh [--v4] prepare        # with the last chunk (+ .whl/<set>/plugin)
#                                                             # carried: install, write the model, stop there
#   bash tests/gpu/dsa/run_on_device.sh [--v4] run [ARGS...]  # install and write the model unless a call on
#                                                             # this machine did, then run compare.py ARGS
#   bash tests/gpu/dsa/run_on_device.sh [--v4] steps [ARGS...] # the same with the deeper model (STEPS_LAYERS,
#                                                             # default 16; STEPS_ARCH v4 or dsa, default the
#                                                             # set's), then steps.py ARGS: decode step time
# The V4 set holds everything the V3.2 model needs too, so `--v4 steps` with STEPS_ARCH=dsa measures V3.2 on the
# staged V4 set, and `--v4 run` with RUN_ARCH=dsa runs V3.2's comparison (its own model, compare.py's V3.2
# defaults) on it.
# <set> is dsa, or v4 with --v4. ARGS go to tests/gpu/dsa/compare.py (default: --phase compare --kernels both;
# for the V4 model "--arch v4" comes first, default --kernels both; V4's two servers do not fit one call, so its
# README runs `--kernels sglang` and `--kernels pdserve` in two calls on one warm machine and judges them with
# `diff.py OUT1 OUT2`). Results and server logs go to $OUT (or
# ./<set>-out). PDSERVE_COMMIT, if set, is recorded. DSA_TIMEOUT (default: 560 s less the time the steps
# before took) bounds compare.py. The pdserve-kernels wheel, if carried in .whl/<set>/plugin/, is kept
# beside the staged wheels (a later call needs not carry it again) and installed into the same --target,
# so its dist-info (the sglang.srt.plugins entry point) is on sys.path.
# JIT caches (a bare machine spends minutes of its first start compiling): DSA_JIT_CACHE=save writes
# them to $OUT/jit-cache.tgz after the run; with .whl/<set>/jit-cache.tgz carried they are restored first.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
tier=dsa
if [ "${1:-}" = --v4 ]; then tier=v4; shift; fi
out=${OUT:-$PWD/$tier-out}
mkdir -p "$out"
# Not the PD tier's /var/tmp/pdserve-wheels: the sets hold differently trimmed sglang_kernel wheels under
# the same file name. (PDSERVE_WHEEL_CHUNKS, PDSERVE_WHEEL_STAGE: for the CPU test of this staging.)
chunks=${PDSERVE_WHEEL_CHUNKS:-.whl/$tier}
staged=${PDSERVE_WHEEL_STAGE:-/var/tmp/pdserve-$tier-wheels}
mkdir -p "$staged"
for chunk in "$chunks"/c*/; do
  [ -d "$chunk" ] && cp -n "$chunk"*.whl "$staged"/ 2>/dev/null
done
# The plugin wheel carried in this call replaces the staged one (a rebuild keeps its file name).
staged_plugin=$staged-plugin
mkdir -p "$staged_plugin"
carried=()
for w in "$chunks"/plugin/*.whl; do [ -f "$w" ] && carried+=("$w"); done
if [ ${#carried[@]} -gt 0 ]; then
  rm -f "$staged_plugin"/*.whl && cp "${carried[@]}" "$staged_plugin"/
fi
# shellcheck disable=SC2012  # a count for the log, of wheel files pip named
echo "staged: $(ls "$staged" | wc -l) wheels, $(du -sh "$staged" | cut -f1); plugin: $(ls "$staged_plugin")"
mode=${1:-run}
case $mode in
  stage) exit 0 ;;
  prepare|run|steps) [ $# -gt 0 ] && shift ;;
  *) echo "usage: run_on_device.sh [--v4] stage|prepare|run|steps [ARGS...], not '$mode'"; exit 2 ;;
esac
# The model: the set's own, or (V4 set only) the one RUN_ARCH / STEPS_ARCH names; checked before anything is
# installed, so a typo costs no device time.
arch=$tier
[ "$tier" = v4 ] || arch=dsa
if [ "$mode" = steps ]; then
  arch=${STEPS_ARCH:-$arch}
  choice=STEPS_ARCH
else
  arch=${RUN_ARCH:-$arch}
  choice=RUN_ARCH
fi
case $arch in v4|dsa) ;; *) echo "$choice must be v4 or dsa, not '$arch'"; exit 2 ;; esac
if [ "$tier" = dsa ] && [ "$arch" = v4 ]; then
  echo "$choice=v4 needs the V4 wheel set (TileLang, z3): run_on_device.sh --v4 ..."; exit 2
fi
layers=${STEPS_LAYERS:-16}
case $layers in
  ''|*[!0-9]*|0) echo "STEPS_LAYERS must be a whole number of layers (1 or more), not '$layers'"; exit 2 ;;
esac
# A fresh machine has lost what earlier calls staged: say so before installing half a set. (wheelhouse.py
# reads the pins: comment lines in wheelhouse.txt are no distributions.)
missing=$(python3 -c 'import sys; sys.path.insert(0, "."); from tests.gpu.wheelhouse import unstaged
print(" ".join(unstaged(sys.argv[1], sys.argv[2])))' "$tier" "$staged") \
  || { echo "could not read the pins (tests/gpu/wheelhouse.py)"; exit 1; }
if [ -n "$missing" ]; then
  echo "not staged: $missing (stage each of $chunks/c*/ on this machine first: one call per chunk)"
  exit 1
fi

site=/tmp/pdserve-$tier-site
plugin=()
for w in "$staged_plugin"/*.whl; do [ -f "$w" ] && plugin+=("$w"); done
# Install once per distinct set of wheels (a second `run` on a warm machine skips the ~8 s).
# shellcheck disable=SC2012  # the listing (names, sizes, times) is the stamp; find has no such one-liner
stamp=$(ls -l "$staged" "${plugin[@]}" 2>/dev/null | md5sum | cut -d' ' -f1)
if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$staged"/*.whl "${plugin[@]}" || { echo "wheel install failed"; exit 1; }
  echo "$stamp" > "$site/.stamp"
fi
# shellcheck disable=SC2012  # a count for the log, of directories pip named
echo "installed: $(ls -d "$site"/*.dist-info | wc -l) distributions; plugin wheels: ${plugin[*]:-none}"
export PYTHONPATH="$site:$PWD/pkg:$PWD"
# As in the probe that served (facts/sglang-dsa.md §4): DeepGEMM's _C.so and tvm-ffi find the image's
# CUDA 13 libraries and torch's here.
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
nvidia_libs=$(python3 -c 'import glob, os, torch; base = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))))')
export LD_LIBRARY_PATH="${nvidia_libs}:${torch_lib}:$site/tvm_ffi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# V4's mHC ops are TileLang kernels, whose libtvm_compiler.so links z3-solver's libz3.so.4.15 (facts/sglang-dsv4.md §2).
[ "$tier" = v4 ] && export LD_LIBRARY_PATH="$site/z3/lib:$LD_LIBRARY_PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import importlib.metadata as m, sys
def v(p):
    try: return m.version(p)
    except m.PackageNotFoundError: return "absent"
print(sys.version.split()[0], *[f"{p} {v(p)}" for p in ("torch", "sglang", "sglang-kernel", "sgl-deep-gemm", "flashinfer-python", "transformers", "safetensors", "tilelang", "z3-solver", "torch-c-dlpack-ext", "pdserve-kernels")], sep="; ")
print("sglang.srt.plugins:", [f"{e.name}={e.value}" for e in m.entry_points(group="sglang.srt.plugins")])'
  echo "commit ${PDSERVE_COMMIT:-unknown}"
} 2>&1 | tee "$out/machine.txt"
# TileLang (and its z3) must import before a V4 server spends minutes starting: a missing library shows here.
if [ "$tier" = v4 ] && ! python3 -c 'import tilelang; print("tilelang", tilelang.__version__, "imports")' 2>&1 \
    | tee -a "$out/machine.txt" | tail -1 | grep -q imports; then
  echo "tilelang does not import (see $out/machine.txt)"; exit 1
fi

# SGLang's tvm-ffi kernels, DeepGEMM, Triton, FlashInfer and TorchInductor (the indexer's head gate is
# torch.compile'd) each keep their own cache; V4 adds TileLang's.
jit_dirs=("$HOME/.cache/tvm-ffi" "$HOME/.deep_gemm" "$HOME/.triton" "$HOME/.cache/flashinfer" "/tmp/torchinductor_$(id -un)"
          "$HOME/.tilelang")
if [ -f ".whl/$tier/jit-cache.tgz" ]; then
  tar -xPzf ".whl/$tier/jit-cache.tgz" && echo "restored JIT caches ($(du -h ".whl/$tier/jit-cache.tgz" | cut -f1))"
fi

model=/tmp/pdserve-$arch-model
depth=()
if [ "$mode" = steps ]; then
  model=/tmp/pdserve-$arch-model-l$layers
  depth=(--layers "$layers")
fi
writer=tests/gpu/dsa/tiny_dsa_model.py
[ "$arch" = v4 ] && writer=tests/gpu/dsa/tiny_v4_model.py
if [ ! -f "$model/model.safetensors" ]; then
  # Written beside and renamed when checked, so an interrupted call leaves no half-written model behind.
  rm -rf "$model.tmp"
  python3 "$writer" "$model.tmp" "${depth[@]}" --check 2>&1 | tee "$out/model.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "model writing or its check failed"; exit 1; }
  rm -rf "$model" && mv "$model.tmp" "$model"
fi
if [ "$mode" = prepare ]; then
  echo "prepared in ${SECONDS} s: wheels installed in $site, model in $model"; exit 0
fi
# What is left of the call for the driver: `timeout 0` would mean no limit at all.
budget=${DSA_TIMEOUT:-$((560 - SECONDS))}
if [ "$budget" -lt 60 ]; then
  echo "only ${budget} s of this call's 560 s are left after ${SECONDS} s of setup: call again (a warm machine keeps the wheels and model)"
  exit 1
fi
if [ "$mode" = steps ]; then
  timeout "$budget" python3 tests/gpu/dsa/steps.py --arch "$arch" --model "$model" \
    --out "$out" "$@" 2>&1 | tee "$out/steps.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "$arch" = v4 ]; then
  set -- --arch v4 "$@"
  [ $# -gt 2 ] || set -- "$@" --kernels both
else
  [ $# -gt 0 ] || set -- --phase compare --kernels both
fi
# A device call ends at 600 s: what is left of 560 s after the steps above (about 35 s on a fresh
# machine) goes to compare.py, which then has ~40 s to stop its server on SIGTERM.
timeout "$budget" python3 tests/gpu/dsa/compare.py --model "$model" --out "$out" "$@" 2>&1 \
  | tee "$out/compare.log"
rc=${PIPESTATUS[0]}
if [ "${DSA_JIT_CACHE:-}" = save ]; then
  present=(); for d in "${jit_dirs[@]}"; do [ -d "$d" ] && present+=("$d"); done
  [ ${#present[@]} -gt 0 ] && tar -cPzf "$out/jit-cache.tgz" "${present[@]}" \
    && echo "saved JIT caches: $(du -h "$out/jit-cache.tgz" | cut -f1) from ${present[*]}"
fi
exit "$rc"
