"""A unit's journal through `journalctl`: its recent lines, or one invocation's from its start; each call
bounded by the caller's timeout."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

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


_INVOCATION_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class InvocationScan:
    """Lines of one invocation of a unit that contain a needle, from its start; `incomplete` says why the
    scan stopped before the invocation's last line (None: it read all of it)."""

    lines: tuple[str, ...]
    incomplete: str | None = None


def grep_invocation(invocation_id: str, needle: str, timeout: float, max_lines: int = 1_000_000,
                    command: Sequence[str] = ("journalctl",)) -> InvocationScan:
    """Lines of the invocation systemd calls `invocation_id` (`systemctl show -p InvocationID`) that contain
    `needle`, read from its first line: what a server logged when it started stays readable however long it
    ran (grep_journal reads the tail). Every process of the unit writes to the stream journald tags with the
    invocation, so the lines of SGLang's scheduler processes are here too. Unavailable when journalctl is
    missing or fails before printing anything; a scan cut short by `timeout` or `max_lines` keeps its lines.
    `command`: a prefix ending in journalctl (the container tier's nsenter), like probes.systemctl's."""
    if not _INVOCATION_ID.fullmatch(invocation_id):
        raise ValueError(f"not a systemd invocation id: {invocation_id!r}")
    if shutil.which(command[0]) is None:
        raise Unavailable(f"{command[0]} is not on PATH")
    argv = [*command, f"_SYSTEMD_INVOCATION_ID={invocation_id}", "-o", "cat", "--no-pager"]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        raise Unavailable(f"cannot run {argv[0]}: {exc.strerror}") from None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    found: list[str] = []
    read = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            read += 1
            if needle in line:
                found.append(line.rstrip("\n"))
            if read >= max_lines:
                break
    finally:
        timer.cancel()
        if proc.poll() is None and read >= max_lines:
            proc.kill()
        try:
            _, stderr = proc.communicate(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            stderr = ""
    if expired.is_set():
        return InvocationScan(tuple(found), f"journalctl did not finish within {timeout:g} s ({read} lines read)")
    if read >= max_lines:
        return InvocationScan(tuple(found), f"stopped after the first {max_lines} lines")
    if proc.returncode != 0 and read == 0:
        raise Unavailable(f"`{' '.join(argv)}` exited {proc.returncode}: {(stderr or '').strip()[:200]}")
    return InvocationScan(tuple(found))
