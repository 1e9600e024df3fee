"""The history file the owner names: one JSON line per run, appended, so a later run (after an upgrade,
a new kernel, a changed mem_fraction_static) shows its change against the last run of the same workload.

JSON Lines because appending never rewrites what earlier runs wrote, and a run cut short leaves at worst
one partial last line, which the reader skips (and says so) instead of losing the file. `last()` is pure;
`append()` and `read()` are the file's edge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.bench.sweep import Sweep
from pdserve.bench.workload import Workload
from pdserve.probes.http import NotJson, parse_json
from pdserve.schema import strict_json

SCHEMA_VERSION = 1
MAX_BYTES = 64 * 1024 * 1024  # years of daily runs; a larger file is not a history pdserve wrote


@dataclass(frozen=True)
class Read:
    entries: list[dict[str, Any]]
    skipped: int = 0  # lines that were not an entry (a run cut short while writing, a hand edit)
    problem: str | None = None  # the file could not be read at all


def entry(deployment: str, at: str, workload: Workload, sweeps: Sequence[Sweep]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "at": at, "deployment": deployment, "workload": workload.as_dict(),
            "sweeps": {s.layout: s.as_dict() for s in sweeps}}


def parse(data: bytes) -> Read:
    entries, skipped = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            value = parse_json(line)
        except NotJson:
            skipped += 1
            continue
        if isinstance(value, dict) and value.get("schema_version") == SCHEMA_VERSION and \
                isinstance(value.get("workload"), dict) and isinstance(value.get("sweeps"), dict):
            entries.append(value)
        else:
            skipped += 1
    return Read(entries, skipped)


def last(entries: Sequence[Mapping[str, Any]], deployment: str, workload: Workload) -> Mapping[str, Any] | None:
    """The latest entry of the same deployment and the same workload (every field equal: a changed
    length or sweep is another workload, whose figures do not compare)."""
    wanted = strict_json.safe(workload.as_dict())
    for item in reversed(entries):
        if item.get("deployment") == deployment and item.get("workload") == wanted:
            return item
    return None


def read(path: Path) -> Read:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return Read([])
    except OSError as exc:
        return Read([], problem=f"cannot read the history file {path}: {exc.strerror}")
    if len(data) > MAX_BYTES:
        return Read([], problem=f"the history file {path} is larger than {MAX_BYTES} bytes; start a new one")
    return parse(data)


def append(path: Path, item: Mapping[str, Any]) -> None:
    """One line, written with one write() on an O_APPEND descriptor: two runs appending at once do not
    interleave their lines."""
    line = (strict_json.dumps(item) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
