"""The router (smg) version a running router was started from.

The version is read from what the process runs, not from what it says on the network: the verifier finds
the router's process (the unit's MainPID, or whoever listens on the router's port) and reads which `smg`
package that process has loaded (/proc/<pid>/maps names its Rust extension, smg/smg_rs.abi3.so); the
package's dist-info beside it holds the version. When the maps are unreadable it asks the process's own
Python (argv[0]) instead.
"""

from __future__ import annotations

import glob
import os
import subprocess

from pdserve.probes.observations import Unavailable


def _marker(distribution: str) -> str:
    # The Rust extension's path inside the import package (site-packages/smg/smg_rs.abi3.so): the package
    # directory alone could match an unrelated path that happens to have a directory of that name.
    return f"{os.sep}{distribution}{os.sep}{distribution}_rs."


def _loaded_package_dir(pid: int, marker: str) -> str | None:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                if marker in path:
                    return path[: path.index(marker)]
    except OSError:
        return None
    return None


def _dist_info_version(site_packages: str, distribution: str) -> str | None:
    for meta in sorted(glob.glob(os.path.join(site_packages, f"{distribution}-*.dist-info", "METADATA"))):
        with open(meta, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def _argv0(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            first = handle.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return None
    return first if os.path.isabs(first) and os.path.exists(first) else None


def router_version(pids: set[int], timeout: float, distribution: str) -> tuple[str, str]:
    """(version, where it came from) of `distribution` (the router's, pdserve.schema.pins) among `pids`."""
    marker = _marker(distribution)
    if not pids:
        raise Unavailable("no router process found (not running, or owned by another user: run as root)")
    for pid in sorted(pids):
        site = _loaded_package_dir(pid, marker)
        if site:
            version = _dist_info_version(site, distribution)
            if version:
                return version, f"pid {pid} loaded {site}{os.sep}{distribution}"
    for pid in sorted(pids):
        python = _argv0(pid)
        if not python:
            continue
        try:
            ask = f"import importlib.metadata as m; print(m.version({distribution!r}))"
            done = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"cannot ask {python} for its {distribution} version: {exc}") from None
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip(), f"pid {pid}, {python}"
    raise Unavailable(f"cannot tell which {distribution} router pid(s) {sorted(pids)} run (run as root)")
