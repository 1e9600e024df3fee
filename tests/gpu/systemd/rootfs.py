"""The rootfs the GPU machine boots under systemd-nspawn: what it holds, and what is cut to make it travel.

Debian trixie, not the container tier's bookworm: bookworm's systemd 252 was a problem on the GPU machine
(a previous run of this tier), trixie's 257 booted there. The GPU software is not in it: the host's Python
(torch included), its driver libraries and the staged SGLang site are bind-mounted in (host.py). What it adds
is what the units and that Python need from a system: systemd itself, numactl for the units' NUMA binding,
and a C compiler, because Triton compiles a small launcher per kernel signature at run time (a previous run
failed there without one).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path

from tests.integration.systemd.container import build_rootfs

SUITE = "trixie"
PACKAGES = (
    # PID 1, the system bus the units' sandboxing asks for, and systemd-nspawn itself: the GPU machine has no
    # systemd-container, so the rootfs's own nspawn runs there through the rootfs's loader (host.py).
    "systemd", "systemd-sysv", "systemd-container", "dbus",
    # The units: numactl (NUMA binding in ExecStart=), procps (ps for the harness).
    "numactl", "procps",
    # Triton builds its launchers with `cc` (against the host's Python headers, bound in); FlashInfer JIT-builds
    # its norm kernels at the first CUDA-graph capture with nvcc (the host's, bound in), which needs g++: without
    # it the prefill failed there on the H100 (2026-12-05, "cannot execute 'cc1plus'"). Not run with g++ yet.
    "gcc", "g++", "libc6-dev",
    # systemd 257 dlopens libbpf for its cgroup BPF features; without it the container's log says "Failed to open
    # libbpf, cgroup BPF features disabled" (2026-12-05). Not run with it yet.
    "libbpf1",
    # Shared libraries the host's Python and its extension modules load (libssl: _ssl, libffi: _ctypes,
    # libexpat: pyexpat, libsqlite3: _sqlite3); any other one missing is copied from the host (host.py).
    "libssl3t64", "libffi8", "libexpat1", "libsqlite3-0",
)

# Cut before packing (globs relative to the root, fnmatch semantics): nothing here runs in the tier. Every
# MiB cut is device time saved: the rootfs travels in calls of at most 64 MiB.
CUT = (
    "usr/share/doc/*", "usr/share/man/*", "usr/share/locale/*", "usr/share/info/*",
    "var/cache/apt/*", "var/lib/apt/lists/*",
    # GCC's link-time optimizer and its dump tool (65 MB): Triton's launcher build does not use LTO.
    "usr/libexec/gcc/x86_64-linux-gnu/*/lto1", "usr/bin/x86_64-linux-gnu-lto-dump-*",
    # Sanitizer runtimes and the static C library: a shared launcher links neither.
    "usr/lib/x86_64-linux-gnu/lib*san.so*", "usr/lib/gcc/x86_64-linux-gnu/*/lib*san*",
    "usr/lib/x86_64-linux-gnu/libc.a",
)


def cut_paths(paths: list[str], patterns: tuple[str, ...] = CUT) -> list[str]:
    """The relative paths among `paths` that a pattern of CUT removes (a directory's contents by its glob)."""
    return [p for p in paths if any(fnmatch.fnmatch(p, pattern) for pattern in patterns)]


def trim(root: Path, patterns: tuple[str, ...] = CUT) -> int:
    """Remove what CUT names from `root`; return the bytes freed."""
    freed = 0
    relative = []
    for directory, dirs, files in os.walk(root):
        base = Path(directory).relative_to(root)
        relative += [str(base / name) for name in dirs + files]
    for path in sorted(cut_paths(relative, patterns), key=len):
        target = root / path
        if not target.exists() and not target.is_symlink():
            continue  # inside a directory removed already
        if target.is_dir() and not target.is_symlink():
            freed += sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(target)
        else:
            freed += target.lstat().st_size
            target.unlink()
    return freed


def build(target: Path, log: Path) -> int:
    """debootstrap the rootfs into `target` and trim it; return the bytes trimmed."""
    build_rootfs(target, PACKAGES, log, suite=SUITE)
    return trim(target)
