"""Prometheus as the consumer of the monitoring files: `promtool check config` over each prometheus.yml and
`promtool check rules` over each alerts.yml, many files per call (promtool reports each file on its own)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

TIMEOUT_S = 120


def usable() -> str | None:
    return None if shutil.which("promtool") else "promtool is not installed (apt-get install prometheus)"


def check(kind: str, files: list[Path]) -> dict[Path, str]:
    """`promtool check <kind>` (config or rules) over `files`; file -> promtool's complaint, for the files it
    refused. One call for all; a refusal is then told apart by checking that file alone."""
    if not files:
        return {}
    done = _run(kind, files)
    if done.returncode == 0:
        return {}
    refused = {}
    for path in files:
        alone = _run(kind, [path])
        if alone.returncode != 0:
            refused[path] = (alone.stdout + alone.stderr).strip()[-1500:]
    assert refused, f"promtool check {kind} failed over the batch, yet on no file alone: {done.stderr[-1500:]}"
    return refused


def _run(kind: str, files: list[Path]) -> subprocess.CompletedProcess:
    # Each file's relative paths (rule_files) resolve against the file's directory; --syntax-only would skip that.
    return subprocess.run(["promtool", "check", kind, *map(str, files)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
