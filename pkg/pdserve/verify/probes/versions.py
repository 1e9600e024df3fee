"""The sglang-router version a running router was started from.

sglang-router 0.3.2 has no version endpoint, so the verifier finds the router's process (the unit's
MainPID, or whoever listens on the router's port), takes its Python from /proc/<pid>/exe and asks that
Python's package metadata.
"""

from __future__ import annotations

import subprocess

from pdserve.verify.probes import procs
from pdserve.verify.result import Unavailable

_ASK = "import importlib.metadata as m; print(m.version('sglang-router'))"


def router_version(pids: set[int], timeout: float) -> tuple[str, str]:
    """(version, where it came from) for the first of `pids` whose executable can be asked."""
    if not pids:
        raise Unavailable("no router process found (not running, or owned by another user: run as root)")
    for pid in sorted(pids):
        exe = procs.executable(pid)
        if not exe:
            continue
        try:
            done = subprocess.run([exe, "-c", _ASK], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"cannot ask {exe} for its sglang-router version: {exc}") from None
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip(), f"pid {pid}, {exe}"
        raise Unavailable(f"{exe} (router pid {pid}) has no sglang-router metadata: {done.stderr.strip()[-200:]}")
    raise Unavailable(f"cannot read the executable of router pid(s) {sorted(pids)} (run as root)")
