"""Each command imports what it uses when it runs (issue 42): `pdserve --help` lists every command without
importing one, so it starts without pydantic, httpx or rich; a piped `plan` without httpx or rich. Speed itself
is tests/bench/startup.py's to measure; this holds the imports that make it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = str(Path(__file__).resolve().parents[2] / "pkg")
HEAVY = ("pydantic", "httpx", "rich", "openai", "pdserve.schema.config", "pdserve.verify", "pdserve.cutover")
# Runs a command in-process, then prints the modules it left imported.
PROBE = """
import json, sys
from pdserve.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": PKG}, check=False)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_help_and_version_import_no_command(args):
    assert heavy(imported(*args)) == []


def test_a_commands_own_help_imports_only_that_command():
    modules = imported("plan", "--help")
    assert "pdserve.cli.plan" in modules and heavy(modules) == []
    assert not {"pdserve.cli.verify", "pdserve.cli.cutover", "pdserve.cli.check"} & modules


def test_a_piped_plan_needs_neither_http_nor_rich():
    modules = imported("plan")
    assert "pdserve.schema.config" in modules  # it did read the deployment
    assert [m for m in heavy(modules) if not m.startswith(("pydantic", "pdserve.schema.config"))] == []


def test_the_listing_matches_each_commands_own_short_help():
    import click

    from pdserve.cli.commands import COMMANDS
    from pdserve.cli.main import main

    with click.Context(main) as ctx:
        for name, entry in COMMANDS.items():
            command = main.get_command(ctx, name)
            assert command is not None and command.name == name
            assert command.get_short_help_str(limit=200) == entry.short_help
