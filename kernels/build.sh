#!/usr/bin/env bash
# Build the kernels' fatbins (sm_90a + sm_120a cubins, no PTX; one per kernel) into OUTDIR (default: kernels/build).
# The flags are the contract: kernels/default.nix uses the same ones, and
# tests/kernels/test_build_reproducible.py checks two builds are bit-identical.
# Deliberately absent: -G, -lineinfo and host -g, which embed the build directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/build}"
NVCC="${NVCC:-nvcc}"
mkdir -p "$out"
FLAGS=(
  -std=c++17 -O3
  --fatbin
  -gencode=arch=compute_90a,code=sm_90a
  -gencode=arch=compute_120a,code=sm_120a
)
# Report registers/spills when asked (VERBOSE=1); the output bytes do not change.
if [[ "${VERBOSE:-0}" == 1 ]]; then FLAGS+=(-Xptxas -v); fi
for k in dsa_indexer sparse_mla_decode; do
  "$NVCC" "${FLAGS[@]}" "$here/$k/$k.cu" -o "$out/$k.fatbin"
  echo "$out/$k.fatbin"
done
