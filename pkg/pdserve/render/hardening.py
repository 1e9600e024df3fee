"""The sandbox of every rendered unit: systemd's hardening directives, per role. Pure data.

It lives in the rendered units, so a plain systemd host gets the same sandbox as NixOS (the module adds
none of its own). The base is the block of nixpkgs' ollama module. A GPU server (prefill, decode, the
fallback) is relaxed only where CUDA, NCCL or NIXL/UCX need it, each relaxation with what breaks without
it; the router needs no device and no JIT, so it gets the rest too. Scored with `systemd-analyze
security --offline=yes` (systemd 252) by tests/unit/test_systemd_analyze.py, which prints the table.
"""

from __future__ import annotations

from pdserve.schema.config import Role

Section = list[tuple[str, str]]

# Every unit, GPU server or router.
COMMON: Section = [
    ("NoNewPrivileges", "yes"),
    # The units run as an unprivileged user and need no capability: pinned memory comes from
    # LimitMEMLOCK=, numactl's binding (set_mempolicy, sched_setaffinity) needs none for its own process.
    ("CapabilityBoundingSet", ""),
    # Read-only /usr, /etc, /boot, ...; writable: StateDirectory= (HOME: Triton's, torch's, DeepGEMM's and
    # CUDA's JIT caches, ~/.nv/ComputeCache), CacheDirectory= (Hugging Face), the private /tmp, /dev/shm.
    ("ProtectSystem", "strict"),
    # Relaxed from "yes": the model directory or the SGLang Python often lives under /home or /root (a venv
    # whose bin/python links into pyenv, uv or conda there), and "yes" hides it. The renderer cannot see
    # where a link points, so homes stay readable and are never writable.
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("PrivateMounts", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectHostname", "yes"),
    # Other users' processes vanish from /proc; prefill and decode run as one user and still see each other.
    ("ProtectProc", "invisible"),
    ("LockPersonality", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("RestrictNamespaces", "yes"),
    ("SystemCallArchitectures", "native"),
    ("UMask", "0077"),
    # Not set, on purpose, on any unit:
    # - RemoveIPC: it deletes every SysV and POSIX IPC object of the user (NCCL's /dev/shm segments
    #   included) when the last RemoveIPC unit of that user stops; all four units share one user, so the
    #   router's stop would take the running workers' segments.
    # - PrivateNetwork, IPAddressDeny: the router is the public endpoint; the workers' NCCL bootstrap and
    #   UCX's tcp transport use the host's interface addresses, not loopback.
]

# Prefill, decode and the fallback: SGLang on GPUs.
GPU_SERVER: Section = [
    # Relaxed: PrivateDevices=yes would hide /dev/nvidia* and /dev/infiniband. The device cgroup lets
    # through only these (and /dev/null and friends).
    ("PrivateDevices", "no"),
    ("DevicePolicy", "closed"),
    # Every NVIDIA group of /proc/devices: nvidia-frontend (/dev/nvidia[0-9]*, nvidiactl, nvidia-modeset),
    # nvidia-uvm (without it CUDA cannot initialise), nvidia-caps (MIG), nvidia-nvswitch and nvidia-nvlink.
    ("DeviceAllow", "char-nvidia* rw"),
    # RDMA verbs (/dev/infiniband/uverbs*): UCX's ib transports under NIXL with ib_devices. Absent on a
    # host without RDMA, where the entry matches nothing. Not /dev/infiniband/rdma_cm: NIXL connects UCX
    # endpoints by worker address; a UCX_TLS with rdmacm needs `DeviceAllow=/dev/infiniband/rdma_cm rw` in
    # a drop-in (a path entry would warn at every start on a host without it, so it is not rendered).
    ("DeviceAllow", "char-infiniband_verbs rw"),
    # Relaxed from "pid": the CUDA driver and NVML read /proc/driver/nvidia, SGLang reads /proc/meminfo
    # and /proc/cpuinfo (psutil), NCCL reads /proc/sys/kernel/numa_balancing.
    ("ProcSubset", "all"),
    # AF_NETLINK: getifaddrs(), with which NCCL and UCX list interfaces, and the RDMA netlink of libibverbs.
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
    # Denied: calls that only a capability makes succeed (the bounding set is empty), plus obsolete ones;
    # EPERM is what they return without the capability anyway. Not denied: @debug (pidfd_getfd, which
    # cuMem-based CUDA IPC can use to take a peer's memory-handle fd), @resources (numactl's
    # set_mempolicy and sched_setaffinity), @privileged (chown, setuid and setgid to the process's own IDs
    # and capset dropping capabilities succeed without a capability).
    ("SystemCallFilter", "~@clock @cpu-emulation @module @mount @obsolete @raw-io @reboot @swap"),
    ("SystemCallErrorNumber", "EPERM"),
    # Not set, on purpose:
    # - MemoryDenyWriteExecute: PyTorch, Triton and libffi (ctypes callbacks) map writable code.
    # - PrivateUsers: prefill and decode are two units that hand KV over through CUDA IPC (UCX cuda_ipc);
    #   a user namespace per unit would part them (pidfd_getfd needs ptrace access to the peer), and that
    #   path has not been tried in separate namespaces.
]

# The router, smg (and its pdserve wait-ready gates): HTTP on the network, nothing else.
ROUTER: Section = [
    ("PrivateDevices", "yes"),
    # Relaxed from "pid": the router's Rust binary reads /proc/sys (its allocator's
    # /proc/sys/vm/overcommit_memory, /proc/sys/kernel/random/boot_id), which "pid" hides. (sglang-router
    # 0.3.2 also imported PyTorch, whose cpuinfo needs /proc/cpuinfo; smg imports neither sglang nor torch.)
    ("ProcSubset", "all"),
    ("MemoryDenyWriteExecute", "yes"),
    ("PrivateUsers", "yes"),
    # AF_UNIX: glibc's NSS (nss-systemd) resolves users over a local socket.
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged @resources"),
    ("SystemCallErrorNumber", "EPERM"),
]


def sandbox(role: Role) -> Section:
    """The hardening directives of a role's unit, in the order they are rendered."""
    return COMMON + (ROUTER if role == "router" else GPU_SERVER)
