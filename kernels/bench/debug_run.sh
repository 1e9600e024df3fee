#!/usr/bin/env bash
# Debug aid: bisect a device error over impl / PDL / select, then compute-sanitizer on the first failure.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
bash kernels/build.sh >/dev/null
export PDSERVE_KERNELS_FATBIN="$PWD/kernels/build/dsa_indexer.fatbin"
L1="1,2,513,2049,4096,33333"
for cfg in "wgmma 0 0 2 $L1" "wgmma 0 1 2 $L1" "wgmma 1 1 2 $L1" "mma 0 0 2 $L1" "mma 0 1 2 $L1" "wgmma 0 1 2 600,700" "wgmma 0 1 2 1,2" "wgmma 0 1 2 2,3000" "wgmma 0 1 1 0,3000"; do
  echo "== $cfg"; timeout 60 python3 kernels/bench/debug_case.py $cfg 2>&1 | grep -E "^ok|Error|error" | head -3
done
echo "== sanitizer"
timeout 200 compute-sanitizer --tool memcheck python3 kernels/bench/debug_case.py wgmma 0 1 2 $L1 2>&1 | grep -vE "^\s*$" | head -40
