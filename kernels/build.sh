#!/usr/bin/env bash
# Build the kernels into OUTDIR (default: kernels/build): per module a fatbin (sm_90a + sm_120a cubins, no PTX)
# and its metadata <module>.json (kernel names, threads, shared memory, parameter-struct layout), which
# kernel_metadata.cpp writes from the same headers the kernels are instantiated from; the launchers read it.
# The flags are the contract: kernels/default.nix runs this script, and
# tests/kernels/test_build_reproducible.py checks two builds are bit-identical (fatbins and metadata).
# Deliberately absent: -G, -lineinfo and host -g, which embed the build directory.
#
#   METADATA_ONLY=1   write only the .json files (host compiler, about a second; the CPU tests use it)
#   TUNING=1          the tuning build instead (kernels/tuning/build.sh): sparse_mla_decode from
#                     kernels/tuning/sparse_mla_decode_tuning.cu (the production kernels plus the retired,
#                     experimental and wrong-by-design probe kernels), and dsa_indexer with its timeline stamps,
#                     as <module>_tuning.{fatbin,json}; never installed
#   VERBOSE=1         report registers/spills; ptxas then records its options in each cubin's .note.nv.tkinfo
#                     section, so the bytes differ from a plain build (the SASS does not): build plainly
#                     for anything measured, shipped or compared
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/build}"
NVCC="${NVCC:-nvcc}"
mkdir -p "$out"
# shellcheck disable=SC2054  # -gencode=arch=...,code=... is one nvcc argument, not two array elements
FLAGS=(
  -std=c++17 -O3
  --fatbin
  -gencode=arch=compute_90a,code=sm_90a
  -gencode=arch=compute_120a,code=sm_120a
)
if [[ "${VERBOSE:-0}" == 1 ]]; then FLAGS+=(-Xptxas -v); fi
modules=(dsa_indexer sparse_mla_decode)
defines=()
suffix=""
if [[ "${TUNING:-0}" == 1 ]]; then
  modules=(sparse_mla_decode dsa_indexer)
  defines=(-DPDSERVE_TUNING_PROBES)
  suffix="_tuning"
fi

# The metadata program is host C++ only; it is built in a scratch directory and not kept.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$NVCC" -std=c++17 -x c++ "${defines[@]}" "$here/kernel_metadata.cpp" -o "$tmp/kernel_metadata"
for k in "${modules[@]}"; do
  "$tmp/kernel_metadata" "$k" > "$out/$k$suffix.json"
  echo "$out/$k$suffix.json"
done
if [[ "${METADATA_ONLY:-0}" == 1 ]]; then exit 0; fi
for k in "${modules[@]}"; do
  src="$here/$k/$k.cu"
  # the tuning build's sparse_mla_decode is its own translation unit (the production one plus the tuning kernels)
  if [[ -n "$suffix" && -f "$here/tuning/$k$suffix.cu" ]]; then src="$here/tuning/$k$suffix.cu"; fi
  "$NVCC" "${FLAGS[@]}" "${defines[@]}" "$src" -o "$out/$k$suffix.fatbin"
  echo "$out/$k$suffix.fatbin"
done
