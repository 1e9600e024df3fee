"""The unit's main process, as its ExecStartPost= gate sees it: still there, or gone.

systemd keeps a unit in "activating (start-post)" until its ExecStartPost= command ends, even when the main
process (SGLang, the router) has died meanwhile: its Restart= waits for the gate's deadline, up to half an
hour for a worker. systemd passes the main process's PID to every control process it spawns while one is
known ($MAINPID, systemd.exec(5); for Type=simple/exec the main process exists before ExecStartPost= runs),
so the gate watches that PID and gives up the moment it is gone: the unit fails at once and systemd restarts
it. Outside systemd (a shell, a test) there is no $MAINPID and nothing is watched.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Mapping
from dataclasses import dataclass


class BadMainPid(ValueError):
    """$MAINPID holds something that is no PID; the text names it."""


def main_pid_from(env: Mapping[str, str]) -> int | None:
    """The main process's PID from $MAINPID, None when systemd set none; BadMainPid for anything else than
    a decimal PID above 1 (PID 1 is systemd itself, which a gate must never mistake for its worker)."""
    text = env.get("MAINPID")
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        raise BadMainPid(f"$MAINPID={text[:20]!r} is not a process id")
    pid = int(text)
    if pid <= 1:
        raise BadMainPid(f"$MAINPID={text} is not the unit's main process")
    return pid


@dataclass
class MainProcess:
    """A handle on one process that says whether it still runs and can wait for it to end.

    A pidfd (Linux >= 5.3) names the process itself, not its number, so a PID reused after the worker
    died is never taken for it, and waiting on it wakes the moment the process exits. Where pidfd_open is
    refused (an old kernel, a syscall filter) a signal-0 probe every WAIT_STEP seconds stands in."""

    pid: int
    _fd: int | None = None
    WAIT_STEP = 0.2

    @classmethod
    def open(cls, pid: int) -> MainProcess:
        try:
            fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        return cls(pid, fd)

    def gone(self) -> bool:
        if self._fd is not None:
            readable, _, _ = select.select([self._fd], [], [], 0)
            return bool(readable)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # it exists; it is only not ours to signal
        return False

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True as soon as the process is gone (then at once)."""
        if self._fd is not None:
            readable, _, _ = select.select([self._fd], [], [], max(seconds, 0))
            return bool(readable)
        end = time.monotonic() + max(seconds, 0)
        while not self.gone():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.WAIT_STEP, left))
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MainProcessGone(Exception):
    """The unit's main process ended while its gate waited; the text says which and what follows."""

    def __init__(self, pid: int):
        super().__init__(f"the unit's main process (PID {pid}) exited while its readiness gate waited")
        self.pid = pid


def watched_sleep(main: MainProcess | None):
    """time.sleep, or a sleep that ends with MainProcessGone the moment `main` exits."""
    if main is None:
        return time.sleep

    def sleep(seconds: float) -> None:
        if main.wait(seconds):
            raise MainProcessGone(main.pid)

    return sleep


def check_alive(main: MainProcess | None) -> None:
    """MainProcessGone when `main` has exited; nothing otherwise (nor without a main process to watch)."""
    if main is not None and main.gone():
        raise MainProcessGone(main.pid)
