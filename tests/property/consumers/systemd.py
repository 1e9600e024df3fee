"""systemd 252 as the consumer of the rendered units, in two passes over a whole batch of units at once:

- `systemd-analyze verify --root=ROOT` (the host's units copied in, every executable a unit names stubbed):
  any line on stderr is a unit systemd warns about, which counts as a failure (verify exits 0 on most);
- `systemd --test --system` (as an unprivileged user, which test mode requires): the manager loads the
  units and dumps what it parsed, so each ExecStart=/ExecStartPre=/ExecStartPost= argv, Environment=
  assignment, User= and timeout is read back by systemd's own parser, not by a re-implementation of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HOST_UNITS = Path("/usr/lib/systemd/system")
MANAGER = Path("/lib/systemd/systemd")
ALL_TARGET = "pdserve-prop-all.target"
TIMEOUT_S = 120


def usable() -> str | None:
    """Why this consumer cannot run here (None: it can)."""
    for tool in ("systemd-analyze", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not HOST_UNITS.is_dir() or not MANAGER.is_file():
        return f"{HOST_UNITS} or {MANAGER} is missing (Debian's systemd package)"
    return None


def _inside(root: Path, path: str) -> Path:
    # normpath of an absolute path cannot climb above "/", so the stub stays inside the root.
    return root / os.path.normpath(path).lstrip("/")


def verify(units: dict[str, str], executables: Iterable[str], work: Path) -> tuple[int, list[str]]:
    """systemd-analyze verify over every unit (file name -> text) in one root; its exit status and stderr lines."""
    root = work / "root"
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    target = root / "etc/systemd/system"
    target.mkdir(parents=True)
    for path in set(executables):
        stub = _inside(root, path)
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for name, text in units.items():
        (target / name).write_text(text, encoding="utf-8")
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}",
                           *(str(target / name) for name in units)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


@dataclass
class ParsedUnit:
    """What systemd's manager holds for one unit after loading it."""

    properties: dict[str, list[str]] = field(default_factory=dict)  # "User" -> ["pdserve"], "Environment" -> [...]
    commands: dict[str, list[list[str]]] = field(default_factory=dict)  # "ExecStart" -> [argv, ...]


def _command_line(text: str) -> list[str]:
    """systemd 252's dump of an argv (quote_command_line with SHELL_ESCAPE_EMPTY): words joined by one space,
    a word with a special character in double quotes with `"`, `\\`, `` ` `` and `$` escaped by a backslash."""
    words: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == '"':
            i += 1
            word = []
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                word.append(text[i])
                i += 1
            i += 1
            words.append("".join(word))
        else:
            end = text.find(" ", i)
            end = len(text) if end < 0 else end
            words.append(text[i:end])
            i = end
        if i < len(text):
            assert text[i] == " ", f"unexpected {text[i]!r} in a dumped command line: {text!r}"
            i += 1
    return words


_UNIT = re.compile(r"\t-> Unit (.+):")


def read_back(units: dict[str, str]) -> dict[str, ParsedUnit]:
    """Load every unit (file name -> text) into `systemd --test` and parse its dump. Unit names must be
    distinct; a unit systemd failed to load is missing from the result."""
    # Test mode refuses root; the unprivileged user must reach the files, so not under pytest's 0700 tmp.
    work = Path(tempfile.mkdtemp(prefix="pdserve-prop-units-"))
    try:
        work.chmod(0o755)
        for name, text in units.items():
            (work / name).write_text(text, encoding="utf-8")
        # After= loads a unit without starting it: the one target makes the manager load all of them.
        (work / ALL_TARGET).write_text("[Unit]\nDescription=pdserve property tier\n" +
                                       "".join(f"After={name}\n" for name in units))
        for path in work.iterdir():
            path.chmod(0o644)
        env = {"SYSTEMD_UNIT_PATH": f"{work}:", "HOME": "/", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LANG": "C.UTF-8"}
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(MANAGER),
                               "--test", "--system", f"--unit={ALL_TARGET}", "--no-pager"],
                              capture_output=True, timeout=TIMEOUT_S, env=env, cwd="/", check=False)
        assert done.returncode == 0, f"systemd --test failed: {done.stderr.decode(errors='replace')[-3000:]}"
        return _parse_dump(done.stdout.decode("utf-8", "surrogateescape"), set(units))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parse_dump(text: str, wanted: set[str]) -> dict[str, ParsedUnit]:
    found: dict[str, ParsedUnit] = {}
    current: ParsedUnit | None = None
    command: str | None = None
    # Only "\n" ends a dumped line: U+2028 and friends are part of values (str.splitlines would cut them).
    for line in text.split("\n"):
        unit = _UNIT.fullmatch(line)
        if unit:
            current = found.setdefault(unit[1], ParsedUnit()) if unit[1] in wanted else None
            command = None
            continue
        if current is None:
            continue
        if line.startswith("\t\t-> "):
            command = line[5:].rstrip(":")
        elif line.startswith("\t\t\tCommand Line: ") and command:
            current.commands.setdefault(command, []).append(_command_line(line[len("\t\t\tCommand Line: "):]))
        elif line.startswith("\t\t") and not line.startswith("\t\t\t"):
            command = None
            key, _, value = line[2:].partition(": ")
            current.properties.setdefault(key, []).append(value)
    return found


_SPAN = re.compile(r"(\d+)(y|month|w|d|h|min|s|ms|us)")
_UNIT_SECONDS = {"y": 31557600, "month": 2629800, "w": 604800, "d": 86400, "h": 3600, "min": 60, "s": 1,
                 "ms": 0.001, "us": 0.000001}


def seconds(span: str) -> float:
    """A time span as systemd dumps it ("1h 30min 5s", "infinity") in seconds."""
    if span == "infinity":
        return float("inf")
    parts = span.split()
    matched = [_SPAN.fullmatch(part) for part in parts]
    assert parts and all(matched), f"not a systemd time span: {span!r}"
    return sum(int(m[1]) * _UNIT_SECONDS[m[2]] for m in matched if m)
