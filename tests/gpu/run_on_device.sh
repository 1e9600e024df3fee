#!/usr/bin/env bash
# Runs the GPU tier on a GPU machine that has torch but no SGLang and no network (the H200 test
# machines). The wheel chunks made by tests/gpu/wheelhouse.py arrive one device call at a time:
#   bash tests/gpu/run_on_device.sh stage   # with .whl/cN carried: keep its wheels for the next call
#   bash tests/gpu/run_on_device.sh run     # with the last chunk carried: install all, run the tier
# Logs and the run's measurements go to $OUT (or ./gpu-out). PDSERVE_COMMIT, if set, is recorded with them
# (the device machine gets the working tree without its git history).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
# Where the chunks arrive and where they are kept between calls (overridable for the CPU test of this staging,
# tests/gpu/test_wheelhouse_split.py).
chunks=${PDSERVE_WHEEL_CHUNKS:-.whl}
staged=${PDSERVE_WHEEL_STAGE:-/var/tmp/pdserve-wheels}
mkdir -p "$staged"
for chunk in "$chunks"/c*/; do
  [ -d "$chunk" ] && cp -n "$chunk"* "$staged"/ 2>/dev/null
done
# A wheel larger than a chunk arrives as WHEEL.part1ofN ... WHEEL.partNofN (wheelhouse.py's split) with
# WHEEL.sha256: once every part is here, join them in order and check the digest before pip sees the wheel.
shopt -s nullglob
for digest in "$staged"/*.whl.sha256; do
  wheel=${digest%.sha256}
  parts=("$wheel".part*of*)
  [ ${#parts[@]} -gt 0 ] || continue
  count=${parts[0]##*of}
  if [ ${#parts[@]} -ne "$count" ]; then
    echo "waiting for parts of ${wheel##*/}: ${#parts[@]} of $count here"
    continue
  fi
  for k in $(seq 1 "$count"); do cat "$wheel.part${k}of$count"; done > "$wheel.joining"
  if [ "$(sha256sum < "$wheel.joining" | cut -d' ' -f1)" = "$(cut -d' ' -f1 "$digest")" ]; then
    mv "$wheel.joining" "$wheel" && rm -f "${parts[@]}" "$digest"
    echo "joined ${wheel##*/} from $count parts"
  else
    rm -f "$wheel.joining"
    echo "the parts of ${wheel##*/} do not match its digest"; exit 1
  fi
done
wheels=("$staged"/*.whl)
echo "staged: ${#wheels[@]} wheels, $(du -sh "$staged" | cut -f1)"
[ "${1:-run}" = stage ] && exit 0
missing=("$staged"/*.part*of*)
if [ ${#missing[@]} -gt 0 ]; then
  echo "parts still missing beside: ${missing[*]##*/}"; exit 1
fi
shopt -u nullglob

site=/tmp/pdserve-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$staged"/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$site:$PWD/pkg:$PWD"
# Keep NVLink multicast off on shared hosts (the machine's own policy); SGLang inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import importlib.metadata as m, sys; print(sys.version.split()[0], *[f"{p} {m.version(p)}" for p in ("torch", "sglang", "smg", "sglang-kernel", "nixl-cu13", "flashinfer-python", "transformers")], sep="; ")'
  command -v numactl && numactl -H | head -3
  echo "commit ${PDSERVE_COMMIT:-unknown}"
} 2>&1 | tee "$out/machine.txt"
# test_crash_harness.py drives the same harness with CPU stand-ins: CI runs it; here it would spend
# device time on stand-ins. -rP prints the passed tests' output (the crash-under-load table).
PDSERVE_REQUIRE_GPU_SGLANG=1 PDSERVE_GPU_REPORT="$out/gpu-report.json" \
  timeout "${GPU_TIER_TIMEOUT:-560}" python3 -m pytest tests/gpu -v -rP -p no:cacheprovider --basetemp=/tmp/gpu-tier \
  --ignore=tests/gpu/test_crash_harness.py 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
for log in /tmp/gpu-tier/gpu-pd*/*.log; do [ -f "$log" ] && cp "$log" "$out/"; done
exit "$rc"
