#!/usr/bin/env bash
# The GPU tier under a real systemd, on a GPU machine with no systemd and no network (tests/gpu/README.md,
# "Under systemd"). The payload (payload.py) arrives one part per device call, each copied into $PARTS:
#   bash tests/gpu/systemd/run_on_device.sh stage     # keep the parts carried so far; print the machine's facts
#   bash tests/gpu/systemd/run_on_device.sh smoke     # rootfs parts staged: boot, CUDA + Triton in the sandbox
#   bash tests/gpu/systemd/run_on_device.sh run       # every part staged: unpack, boot, start, verify, kill -9
#   bash tests/gpu/systemd/run_on_device.sh restarts  # after run, same machine: warm, then cold, prefill restart
#   bash tests/gpu/systemd/run_on_device.sh bench     # after run, same machine: pdserve bench --compare single,pd
#     (it runs on in the container past the call; exit 3 = still running: call bench again to wait and collect)
#     (NO_FAULTS=1 ... run: start and verify only, when the call is there for a bench call after it)
# Results go to $OUT (or ./gpu-out). PDSERVE_COMMIT, if set, is recorded with them.
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 1
out=${OUT:-$PWD/gpu-out}
work=${PDSERVE_GPU_WORK:-/var/tmp/pdgpu}
parts=$work/parts
mkdir -p "$out" "$parts"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$work/tree/site:$PWD/pkg:$PWD"
# The GPU machine has no zstd: a call may carry one (a static build, or one with its libzstd beside it).
zstd=zstd
if ! command -v zstd >/dev/null && [ -x "${PDSERVE_ZSTD_DIR:-.gpusd-bin}/zstd" ]; then
  dir=$(cd "${PDSERVE_ZSTD_DIR:-.gpusd-bin}" && pwd)
  zstd="env LD_LIBRARY_PATH=$dir $dir/zstd"
fi
# shellcheck disable=SC2012  # names for the log, of parts payload.py named
echo "staged parts: $(ls "$parts" | tr '\n' ' ')"

facts() {
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  ls -la /dev/nvidia* 2>&1
  ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml' | head
  python3 -c 'import sys, sysconfig as s; print(sys.version.split()[0], sys.executable, sys.prefix, sys.base_prefix,
    s.get_paths()["include"], s.get_config_var("MULTIARCH"))'
  for tool in zstd gcc cc systemd-nspawn numactl; do
    printf '%s: %s\n' "$tool" "$(command -v "$tool" || echo absent)"
  done
  grep cgroup /proc/mounts; cat /proc/self/cgroup; uname -r; nproc; df -h /var/tmp | tail -1
  echo "commit ${PDSERVE_COMMIT:-unknown}"
}

unpack_rootfs_only() {
  # The stream holds the rootfs first: its parts alone unpack it (tar then stops at the cut; that is expected).
  rm -rf "$work/tree/rootfs" && mkdir -p "$work/tree"
  cat "$parts"/part-* | $zstd -dc --long=27 -q 2>/dev/null \
    | tar --numeric-owner -xf - -C "$work/tree" rootfs 2>/dev/null
  test -x "$work/tree/rootfs/usr/lib/systemd/systemd" && echo "rootfs unpacked: $(du -sh "$work/tree/rootfs" | cut -f1)"
}

case "${1:-run}" in
  stage)
    facts 2>&1 | tee "$out/machine.txt"
    ;;
  smoke)
    unpack_rootfs_only || { echo "the rootfs is not complete in the staged parts"; exit 1; }
    timeout 400 python3 -m tests.gpu.systemd.runner smoke --work "$work" --out "$out" \
      --unit-file "${SMOKE_UNIT:-.gpusd-smoke/prefill.service}" 2>&1 | tee "$out/smoke.log"
    ;;
  run)
    if [ ! -d "$work/tree/site/sglang" ]; then
      t0=$(date +%s)
      python3 -m tests.gpu.systemd.payload unpack --parts "$parts" --dest "$work/tree" --zstd "$zstd" || exit 1
      # The units see the site read-only (ProtectSystem=strict): compile its bytecode once, here.
      python3 -m compileall -q -j 16 "$work/tree/site" >/dev/null 2>&1
      echo "unpacked and compiled in $(( $(date +%s) - t0 )) s"
    fi
    # Wheels carried in .whl beside the payload go into the site too: BENCH=1's client imports `datasets`
    # (sglang.benchmark.datasets), which the payload (what the servers import) does not hold.
    if compgen -G ".whl/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$work/tree/site" .whl/*.whl
    fi
    facts > "$out/machine.txt" 2>&1
    python3 -c 'import importlib.metadata as m; print(*[f"{p} {m.version(p)}" for p in ("torch", "sglang", "smg",
      "sglang-router", "sglang-kernel", "nixl-cu13", "triton")], sep="; ")' >> "$out/machine.txt" 2>&1
    timeout "${GPU_TIER_TIMEOUT:-540}" python3 -m tests.gpu.systemd.runner run --work "$work" --out "$out" \
      --start-timeout 360 --budget-s "$(( ${GPU_TIER_TIMEOUT:-540} - 10 ))" \
      ${BENCH:+--cold-restart-needs-s 100000} ${NO_FAULTS:+--no-faults} 2>&1 \
      | tee "$out/run.log"
    # BENCH=1: pdserve bench on the same container right after (the run's cold restart is then left out).
    if [ "${BENCH:-0}" = 1 ]; then
      timeout "${BENCH_TIMEOUT:-300}" python3 -m tests.gpu.systemd.runner bench --work "$work" --out "$out" \
        --budget-s "$(( ${BENCH_TIMEOUT:-300} - 20 ))" --workload "${BENCH_WORKLOAD:-gpu-tier}" 2>&1 | tee "$out/bench.log"
    fi
    ;;
  restarts)
    timeout "${GPU_TIER_TIMEOUT:-540}" python3 -m tests.gpu.systemd.runner restarts --work "$work" --out "$out" 2>&1 \
      | tee "$out/restarts.log"
    ;;
  bench)
    timeout "${GPU_TIER_TIMEOUT:-540}" python3 -m tests.gpu.systemd.runner bench --work "$work" --out "$out" \
      --budget-s "$(( ${GPU_TIER_TIMEOUT:-540} - 20 ))" --workload "${BENCH_WORKLOAD:-gpu-tier}" 2>&1 | tee "$out/bench.log"
    ;;
esac
