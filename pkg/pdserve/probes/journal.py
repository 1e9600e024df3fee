"""A unit's recent journal through `journalctl`, each call bounded by the caller's timeout."""

from __future__ import annotations

import shutil
import subprocess

from pdserve.probes.observations import Unavailable


def _lines(unit: str, lines: int, timeout: float) -> list[str]:
    argv = ["journalctl", "-u", f"{unit}.service", "-n", str(lines), "-o", "cat", "--no-pager"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"`{' '.join(argv)}` did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise Unavailable(f"cannot run {argv[0]}: {exc.strerror}") from None
    # journalctl exits 1 with lines already printed when part of the journal is unreadable: keep them.
    if done.returncode != 0 and not done.stdout:
        raise Unavailable(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout.splitlines()


def journal(unit: str, lines: int, timeout: float) -> list[str]:
    """The unit's last `lines` journal lines (its own messages, no metadata); a line saying why when unreadable."""
    if shutil.which("journalctl") is None:
        return []
    try:
        return [line for line in _lines(unit, lines, timeout) if line.strip()]
    except Unavailable as exc:
        return [f"(journal unavailable: {exc})"]


def grep_journal(unit: str, needle: str, timeout: float, lines: int = 20000) -> list[str]:
    """Lines of the unit's recent journal that contain `needle` (the KV capacity fallback). Filtered here
    rather than with `journalctl --grep`, which needs a journalctl built with PCRE2."""
    if shutil.which("journalctl") is None:
        return []
    try:
        return [line for line in _lines(unit, lines, timeout) if needle in line]
    except Unavailable:
        return []
