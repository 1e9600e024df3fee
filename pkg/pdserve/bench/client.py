"""The client's run for one sweep point: SGLang's benchmark client as a child process, bounded in time.

Its progress bar (tqdm, on stderr) goes to the terminal as it runs; its printed report goes to a log
beside the result file (stdout stays pdserve's own, for --json). The child runs in its own session so that
a deadline or an interrupt ends it and everything it started, and never leaves it running.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

MAX_RESULT_BYTES = 64 * 1024 * 1024  # --output-details: every request's lengths, latencies, answer text, error
STOP_GRACE = 5.0
LOG_TAIL = 2000


@dataclass(frozen=True)
class ClientRun:
    returncode: int | None  # None: ended by pdserve (deadline)
    result: bytes  # the --output-file's bytes (empty when none was written)
    log_tail: str
    problem: str | None = None  # why the run has no usable result, in words


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's session, then SIGKILL after a grace: the client and whatever it started."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - LOG_TAIL))
            return file.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _result(path: Path) -> bytes:
    try:
        with path.open("rb") as file:
            return file.read(MAX_RESULT_BYTES + 1)
    except OSError:
        return b""


def run(argv: list[str], env: dict[str, str], result_file: Path, log_file: Path, deadline_s: float) -> ClientRun:
    """Run the client to its end or `deadline_s`; KeyboardInterrupt ends it first, then goes on up."""
    result_file.unlink(missing_ok=True)  # the client appends: an old record must not pass for this run's
    with log_file.open("wb") as log:
        try:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=None, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            return ClientRun(None, b"", "", f"cannot start the client {argv[0]}: {exc.strerror}")
        try:
            code = proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            _end(proc)
            return ClientRun(None, b"", _tail(log_file), f"the client did not finish within {deadline_s:g} s "
                             "(raise --point-timeout, or send fewer prompts per point)")
        except BaseException:
            _end(proc)
            raise
    result = _result(result_file)
    if len(result) > MAX_RESULT_BYTES:
        return ClientRun(code, b"", _tail(log_file), f"the client's result is larger than {MAX_RESULT_BYTES} bytes")
    if code != 0:
        return ClientRun(code, result, _tail(log_file), f"the client exited {code}: {_last_line(_tail(log_file))}")
    return ClientRun(code, result, _tail(log_file))


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


HELP_DEADLINE = 120.0  # the client imports SGLang before it parses: seconds on a real host
HELP_BYTES = 256 * 1024


def accepts_option(python: str, module: str, option: str, env: dict[str, str],
                   deadline_s: float = HELP_DEADLINE) -> bool | None:
    """Whether the client's own `--help` lists `option` (older SGLang releases lack some, e.g. --goodput
    before 0.5.23, and argparse refuses the whole run for one unknown option); None when it cannot tell."""
    try:
        done = subprocess.run([python, "-m", module, "--help"], env=env, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=deadline_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return option.encode() in done.stdout[:HELP_BYTES]
