"""`pdserve plan`'s plain output runs as shown (issue 42): each role's block, pasted into bash as a person would
paste it, starts the program with exactly the argv and the environment that systemd reads from the unit's
ExecStart= and Environment=. Recording stubs stand at the tool paths; the values are hostile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.plan import UNIT_ONLY_ENVIRONMENT
from tests.conftest import require_or_skip
from tests.property.consumers import systemd

BASH_TIMEOUT = 30
# A space, a substitution and an `=`: the `=` makes env(1) take the program for an assignment unless the
# command is written around it.
TOOL_DIR = "tools $(touch MARK) a=b"
HOSTILE_ENV = {
    "QUOTES": "it's \"q\" $HOME ${X} `touch MARK` $(touch MARK) \\ *.py ; ü",
    "EMPTY": "",
    "EQUALS": "a=b=c",
    "TILDE": "~root:~/x",
    "SPACES": "  lead and trail  ",
    "SEPARATOR": "\u2028 line separator",
    "BANG": "!! !$",
    # bash refuses to assign its read-only variables; they must still reach the program.
    "SHELLOPTS": "xtrace",
    "BASHOPTS": "nullglob",
}
# What bash and the test's own environment add to every command's environment.
BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SHELL_ADDS = {"PWD", "SHLVL", "_", "OLDPWD"}
# Records its argv (with the path it ran as) and environment, NUL-separated, in the directory it runs in.
STUB = """#!/bin/sh
printf '%s\\0' "$0" "$@" >call.argv
exec /usr/bin/env -0 >call.env
"""


@pytest.fixture
def systemd_reader():
    why = systemd.usable()
    require_or_skip(why is None and shutil.which("bash") is not None, why or "bash is not installed",
                    "PDSERVE_REQUIRE_SYSTEMD")


def _stub_tools(root: Path) -> list[str]:
    tools = root / TOOL_DIR
    tools.mkdir()
    for name in ("python", "numactl", "pdserve"):
        (tools / name).write_text(STUB)
        (tools / name).chmod(0o755)
    return ["--sglang-python", str(tools / "python"), "--numactl", str(tools / "numactl"),
            "--pdserve", str(tools / "pdserve")]


def _plan(args: list[str]) -> str:
    result = CliRunner().invoke(main, ["plan", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def role_blocks(text: str) -> dict[str, str]:
    """Each role's block of the plain plan, from its `# --- role: unit ---` line to the blank line after it,
    comments included: what a person selects and pastes."""
    blocks = {}
    for chunk in text.split("\n\n"):
        first = chunk.split("\n", 1)[0]
        if first.startswith("# --- ") and ": sglang-" in first and "unit file" not in first:
            blocks[first.removeprefix("# --- ").split(":", 1)[0]] = chunk + "\n"
    return blocks


def paste(block: str, cwd: Path) -> tuple[list[str], dict[str, str]]:
    """Run the block as bash runs pasted lines (read from its input), in `cwd`; the stub's argv and environment."""
    done = subprocess.run(["bash"], input=block.encode(), cwd=cwd, env=BASE_ENV, capture_output=True,
                          timeout=BASH_TIMEOUT, check=False)
    assert done.returncode == 0 and not done.stderr, done.stderr.decode(errors="replace")
    argv = (cwd / "call.argv").read_bytes().decode().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in (cwd / "call.env").read_bytes().decode().split("\0")[:-1])
    return argv, env


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "api-key"])
def test_each_pasted_block_runs_the_units_argv_with_its_environment(systemd_reader, reference_data, tmp_path,
                                                                   visible_tmp_path, keyed):
    reference_data["environment"].update(HOSTILE_ENV)
    reference_data["model"]["served_name"] = "name with 'quotes' and $(touch MARK)"
    reference_data["prefill"]["extra_args"] = ["--x", "a\\b $HOME", "", "--"]
    if keyed:
        reference_data["router"]["api_key_file"] = "/etc/pdserve/router key"
    config = tmp_path / "d.json"
    config.write_text(json.dumps(reference_data))
    # Where the units could see them: plan shows a placeholder for a tool path the units could not run.
    args = ["-c", str(config), *_stub_tools(visible_tmp_path)]
    units = json.loads(_plan([*args, "--json"]))["units"]
    parsed = systemd.read_back(units)
    blocks = role_blocks(_plan(args))
    assert list(blocks) == ["prefill", "decode", "router", "fallback"]
    for role, block in blocks.items():
        unit = parsed[f"sglang-dsv4{'' if role == 'fallback' else '-' + role}.service"]
        run_dir = tmp_path / f"run-{role}"
        run_dir.mkdir()
        argv, env = paste(block, run_dir)
        (exec_start,) = unit.commands["ExecStart"]
        assert argv == exec_start, role
        expected = {key: value for key, value in (item.split("=", 1) for item in unit.properties.get("Environment", []))
                    if key not in UNIT_ONLY_ENVIRONMENT}
        assert {key: env.get(key) for key in expected} == expected, role
        assert set(env) - set(expected) <= set(BASE_ENV) | SHELL_ADDS | set(UNIT_ONLY_ENVIRONMENT), role
        if role != "router":
            assert expected.keys() >= HOSTILE_ENV.keys()
    assert not any(path.name == "MARK" for path in tmp_path.rglob("*"))
    assert all(str(visible_tmp_path / TOOL_DIR) in block for block in blocks.values())


def test_a_bare_assignment_line_would_not_have_reached_the_program(tmp_path):
    """Why the block is one command: the old form, NAME=value on a line above the command, sets a shell
    variable the program never sees; the stub records that (so the test above can tell the two apart)."""
    stub = tmp_path / "stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    _, env = paste(f"UCX_TLS=tcp\n{stub}\n", tmp_path)
    assert "UCX_TLS" not in env
    assert os.access(stub, os.X_OK)
