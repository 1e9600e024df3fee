#!/usr/bin/env bash
# Builds FlashMLA, the sparse MLA comparator of bench_targets.py and bench_sparse_mla.py, in place in its
# git-ignored copy (default .ext/flashmla: FlashMLA 9241ae3e + CUTLASS 147f5673 headers, staged by
# kernels/bench/stage_targets.sh), on the GPU machine: `PYTHONPATH=.ext/flashmla` then imports `flash_mla`.
#
# Only what the sparse decode needs, for sm_90a only, on every core:
# - FlashMLA's own setup.py runs with its flags unchanged (FLASH_MLA_DISABLE_SM100=1 drops the sm_100f code),
#   but its extension gets a source list cut to the sparse decode: a one-function binding written here
#   instead of its api.cpp (which binds dense decode and both prefills too), the schedule and combine kernels,
#   the four sm90 sparse fp8 decode instantiations, and the three sm100 decode files that the sparse decode
#   dispatcher (api/sparse_decode.h) links against (their device code is compiled out without sm_100f).
#   9 of setup.py's 24 sources; each compiled on the CPU machine with nvcc 13.0 for sm_90a in 13-62 s.
# - CUDA 13 keeps cuda/std/* under include/cccl, which the host g++ does not search by itself
#   (facts/kernels.md): CPLUS_INCLUDE_PATH adds it.
# Prints the build time; the full log goes to $FLASHMLA_BUILD_LOG (default <source>/build.log).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${FLASHMLA_DIR:-.ext/flashmla}
log=${FLASHMLA_BUILD_LOG:-$src/build.log}
[ -f "$src/setup.py" ] || { echo "build_flashmla: no FlashMLA source at $src (kernels/bench/stage_targets.sh stages it)"; exit 1; }
start=$SECONDS

# The toolkit's root (an nvcc on PATH may be a wrapper script elsewhere, so /usr/local/cuda comes first).
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
fi
export CUDA_HOME
# torch's CUDA headers include cusparse.h and the like; where the toolkit lacks one, the CUDA wheels beside
# torch have it (searched after the toolkit's own include directory, which comes as -I).
wheel_includes=$(python3 -c 'import glob, os, torch; base = os.path.dirname(os.path.dirname(torch.__file__)); print(":".join(sorted(glob.glob(os.path.join(base, "nvidia", "*", "include")))))')
export CPLUS_INCLUDE_PATH="$CUDA_HOME/include/cccl${wheel_includes:+:$wheel_includes}${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
export FLASH_MLA_DISABLE_SM100=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=1
# The system gcc/g++ for the host code and the link (torch takes CXX, and CC as nvcc's -ccbin): on the GPU
# image an extension built by its default compiler wrapper brought a second libstdc++ into the process, and
# DeepGEMM's first JIT call, in the same process as FlashMLA here, then crashed in std::regex (facts/kernels.md).
if [ -z "${CXX:-}" ] && [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
echo "build_flashmla: host compiler ${CXX:-c++} ($("${CXX:-c++}" --version | head -1))"
# setup.py runs `git submodule update` and `git rev-parse`: keep them off the repository around .ext.
export GIT_DIR=/nonexistent
# torch's BuildExtension compiles in parallel only through ninja; the image's ninja sits beside its python3.
PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
python3 -c 'from torch.utils.cpp_extension import is_ninja_available as n; assert n(), "no ninja: the build would be serial"'

# Rewritten only when it differs, so a second build in the same tree recompiles nothing.
binding="$src/csrc/api/pdserve_sparse_decode_api.cpp"
cat > "$binding.new" <<'EOF'
// Written by pdserve's kernels/bench/build_flashmla.sh: FlashMLA's module with the sparse decode entry point only.
#include <pybind11/pybind11.h>

#include "sparse_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}
EOF
if cmp -s "$binding.new" "$binding"; then rm "$binding.new"; else mv "$binding.new" "$binding"; fi

(cd "$src" && python3 - > "$log" 2>&1 <<'EOF'
import runpy
import sys

import torch.utils.cpp_extension as cpp_extension

NEEDED = ("csrc/smxx/decode/", "csrc/sm90/decode/sparse_fp8/", "csrc/sm100/decode/head64/",
          "csrc/sm100/prefill/sparse/fwd_for_small_topk/head128/instantiations/phase1_decode_k512.cu")
full = cpp_extension.CUDAExtension


def sparse_decode_only(name, sources, *args, **kwargs):
    kept = [s for s in sources if s.startswith(NEEDED)]
    assert len(kept) == 9, f"FlashMLA's setup.py lists other sources than expected: {kept}"
    return full(name, ["csrc/api/pdserve_sparse_decode_api.cpp", *kept], *args, **kwargs)


cpp_extension.CUDAExtension = sparse_decode_only   # setup.py imports it from this module
sys.argv = ["setup.py", "build_ext", "--inplace"]
runpy.run_path("setup.py", run_name="__main__")
EOF
) || { tail -40 "$log"; echo "build_flashmla: FAILED after $((SECONDS - start)) s (log: $log)"; exit 1; }
PYTHONPATH="$src" python3 -c 'import flash_mla, flash_mla.cuda as c; assert hasattr(c, "sparse_decode_fwd")' \
  || { echo "build_flashmla: built, but flash_mla does not import"; exit 1; }
echo "build_flashmla: flash_mla built in $((SECONDS - start)) s ($(ls "$src"/flash_mla/cuda*.so))"
