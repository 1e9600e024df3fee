#!/usr/bin/env bash
# The DSA comparison on a GPU machine that has torch but no SGLang and no network (the H200 test
# machines). The wheel chunks of `tests/gpu/wheelhouse.py --dsa` arrive one device call at a time:
#   bash tests/gpu/dsa/run_on_device.sh stage            # with .whl/dsa/cN carried: keep its wheels
#   bash tests/gpu/dsa/run_on_device.sh run [ARGS...]    # with the last chunk (+ .whl/dsa/plugin) carried:
#                                                        # install, write the model, run compare.py ARGS
# ARGS go to tests/gpu/dsa/compare.py (default: --phase compare --kernels both). Results and server
# logs go to $OUT (or ./dsa-out). PDSERVE_COMMIT, if set, is recorded. DSA_TIMEOUT (default: 560 s
# less the time the steps before took) bounds compare.py. The pdserve-kernels wheel, if carried in
# .whl/dsa/plugin/, is installed into the same --target, so its dist-info (the sglang.srt.plugins
# entry point) is on sys.path.
# JIT caches (a bare machine spends ~2 min of its first start compiling): DSA_JIT_CACHE=save writes
# them to $OUT/jit-cache.tgz after the run; with .whl/dsa/jit-cache.tgz carried they are restored first.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
out=${OUT:-$PWD/dsa-out}
mkdir -p "$out"
# Not the PD tier's /var/tmp/pdserve-wheels: the two sets hold differently trimmed sglang_kernel
# wheels under the same file name.
staged=/var/tmp/pdserve-dsa-wheels
mkdir -p "$staged"
for chunk in .whl/dsa/c*/; do
  [ -d "$chunk" ] && cp -n "$chunk"*.whl "$staged"/ 2>/dev/null
done
# shellcheck disable=SC2012  # a count for the log, of wheel files pip named
echo "staged: $(ls "$staged" | wc -l) wheels, $(du -sh "$staged" | cut -f1)"
[ "${1:-run}" = stage ] && exit 0
[ "${1:-}" = run ] && shift
# A fresh machine has lost what earlier calls staged: say so before installing half a set.
missing=$(python3 - "$staged" <<'EOF_PY'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.gpu.wheelhouse import PINS, _pin_name, dsa_pins
have = {w.name.split("-", 1)[0].lower() for w in Path(sys.argv[1]).glob("*.whl")}
print(" ".join(p for p in (_pin_name(line) for line in dsa_pins(PINS.read_text()).splitlines()) if p not in have))
EOF_PY
)
if [ -n "$missing" ]; then
  echo "not staged: $missing (stage .whl/dsa/c1..c3 on this machine first)"; exit 1
fi

site=/tmp/pdserve-dsa-site
plugin=()
for w in .whl/dsa/plugin/*.whl; do [ -f "$w" ] && plugin+=("$w"); done
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
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import importlib.metadata as m, sys
def v(p):
    try: return m.version(p)
    except m.PackageNotFoundError: return "absent"
print(sys.version.split()[0], *[f"{p} {v(p)}" for p in ("torch", "sglang", "sglang-kernel", "sgl-deep-gemm", "flashinfer-python", "transformers", "safetensors", "pdserve-kernels")], sep="; ")
print("sglang.srt.plugins:", [f"{e.name}={e.value}" for e in m.entry_points(group="sglang.srt.plugins")])'
  echo "commit ${PDSERVE_COMMIT:-unknown}"
} 2>&1 | tee "$out/machine.txt"

# SGLang's tvm-ffi kernels, DeepGEMM, Triton, FlashInfer and TorchInductor (the indexer's head gate is
# torch.compile'd) each keep their own cache.
jit_dirs=("$HOME/.cache/tvm-ffi" "$HOME/.deep_gemm" "$HOME/.triton" "$HOME/.cache/flashinfer" "/tmp/torchinductor_$(id -un)")
if [ -f .whl/dsa/jit-cache.tgz ]; then
  tar -xPzf .whl/dsa/jit-cache.tgz && echo "restored JIT caches ($(du -h .whl/dsa/jit-cache.tgz | cut -f1))"
fi

model=/tmp/pdserve-dsa-model
if [ ! -f "$model/model.safetensors" ]; then
  # Written beside and renamed when checked, so an interrupted call leaves no half-written model behind.
  rm -rf "$model.tmp"
  python3 tests/gpu/dsa/tiny_dsa_model.py "$model.tmp" --check 2>&1 | tee "$out/model.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "model writing or its check failed"; exit 1; }
  rm -rf "$model" && mv "$model.tmp" "$model"
fi
[ $# -gt 0 ] || set -- --phase compare --kernels both
# A device call ends at 600 s: what is left of 560 s after the steps above (about 35 s on a fresh
# machine) goes to compare.py, which then has ~40 s to stop its server on SIGTERM.
timeout "${DSA_TIMEOUT:-$((560 - SECONDS))}" python3 tests/gpu/dsa/compare.py --model "$model" --out "$out" "$@" 2>&1 \
  | tee "$out/compare.log"
rc=${PIPESTATUS[0]}
if [ "${DSA_JIT_CACHE:-}" = save ]; then
  present=(); for d in "${jit_dirs[@]}"; do [ -d "$d" ] && present+=("$d"); done
  [ ${#present[@]} -gt 0 ] && tar -cPzf "$out/jit-cache.tgz" "${present[@]}" \
    && echo "saved JIT caches: $(du -h "$out/jit-cache.tgz" | cut -f1) from ${present[*]}"
fi
exit "$rc"
