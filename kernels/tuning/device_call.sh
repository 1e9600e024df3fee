# shellcheck shell=bash
# Sourced (not run) by the tuning scripts that make one device call (run_ab.sh, run_es.sh, run_small_batch.sh,
# run_wgt.sh, profile_ds.sh), with their default output folder as $1: the repository root as the working
# directory, $OUT (default $1) created, unbuffered python, both launchers pointed at kernels/build's fatbins (the
# build the call carried). record_gpu and record_builds put what the call ran on into $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT="${OUT:-$1}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
export PDSERVE_SPARSE_MLA_FATBIN="$PWD/kernels/build/sparse_mla_decode.fatbin"

# The GPU, its driver, clocks and temperature, into $OUT/gpu.txt.
record_gpu() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
}
# The checksums of the builds the call used (the files given), into $OUT/sha.txt.
record_builds() {
  sha256sum "$@" | tee "$OUT/sha.txt"
}
