"""One CLI contract (issue 15, item 3): every command exits by the one table of pdserve.cli.exits, prints
it in `--help`, and shares one -c/--config option; asserted command by command on real invocations."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pdserve.cli.exits import TABLE, Exit
from pdserve.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ["--sglang-python", "/opt/sg/bin/python", "--numactl", "/usr/bin/numactl", "--pdserve", "/opt/pd/bin/pdserve"]

# Each command as a user runs it, with "{file}" where the deployment file goes and "{out}" for a directory.
COMMANDS = {
    "plan": ["plan", "-c", "{file}", *TOOLS],
    "check": ["check", "-c", "{file}", "--no-host", "--no-parsers"],
    "render": ["render", "-c", "{file}", "--out", "{out}", *TOOLS, "--no-python-check"],
    "wait-ready": ["wait-ready", "prefill", "-c", "{file}", "--timeout", "0", "--probe-timeout", "0.2"],
    "verify": ["verify", "-c", "{file}", "--only", "units"],
    "cutover": ["cutover", "pd", "-c", "{file}", "--dry-run"],
    "bench": ["bench", "-c", "{file}", "--workload", "smoke", "--sglang-python", "/opt/sg/bin/python"],
}
ALL = [*COMMANDS, "schema"]


def invoke(args: list[str], tmp_path: Path, file: Path | None = None):
    filled = [a.replace("{file}", str(file)).replace("{out}", str(tmp_path / "out")) for a in args]
    return CliRunner().invoke(main, filled)


def broken_toml(tmp_path: Path) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text('name = "dsv4"\n[model\npath = "/m"\n')
    return path


def broken_field(tmp_path: Path, reference_data) -> Path:
    reference_data["prefill"]["port"] = 70000
    path = tmp_path / "field.json"
    path.write_text(json.dumps(reference_data))
    return path


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("breakage", ["invalid TOML", "a field out of range"])
def test_a_broken_deployment_file_exits_1_from_every_command(tmp_path, reference_data, command, breakage):
    file = broken_toml(tmp_path) if breakage == "invalid TOML" else broken_field(tmp_path, reference_data)
    result = invoke(COMMANDS[command], tmp_path, file)
    assert result.exit_code == Exit.PROBLEMS, result.output
    expected = "is not valid TOML" if breakage == "invalid TOML" else "error: prefill.port = 70000"
    assert expected in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ALL)
def test_a_wrong_command_line_exits_2_from_every_command(tmp_path, command):
    result = CliRunner().invoke(main, [command, "--frobnicate"])
    assert result.exit_code == Exit.USAGE, result.output
    assert "No such option '--frobnicate'" in result.output


@pytest.mark.parametrize("command", ALL)
def test_a_crash_inside_a_command_exits_3_with_its_reason(tmp_path, monkeypatch, command):
    def crash(*_args, **_kwargs):
        raise ZeroDivisionError("injected crash")

    if command == "schema":
        monkeypatch.setattr("pdserve.cli.schema_command.json_schema", crash)
        args = ["schema"]
    elif command == "check":
        # A crashed check: the host check blows up on a host it was asked to check.
        monkeypatch.setattr("pdserve.check.run.check_host", crash)
        args = ["check", "--host", "--no-parsers"]
    else:
        monkeypatch.setattr("pdserve.cli.options.load_renderable", crash)
        args = [a for a in COMMANDS[command] if a not in {"-c", "{file}"}]
    result = invoke(args, tmp_path)
    assert result.exit_code == Exit.INTERNAL, result.output
    assert "internal error: ZeroDivisionError: injected crash" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


@pytest.mark.parametrize(("command", "args"), [
    ("plan", ["plan", *TOOLS]),
    ("check", ["check", "--no-host", "--no-parsers"]),
    ("render", ["render", "--out", "{out}", *TOOLS, "--no-python-check"]),
    ("schema", ["schema"]),
    ("verify", ["verify", "--list"]),
])
def test_success_exits_0(tmp_path, command, args):
    result = invoke(args, tmp_path)
    assert result.exit_code == Exit.OK, result.output


def test_what_is_not_right_exits_1(tmp_path):
    # A gate whose deadline passed, and a check that failed, are problems too (not usage, not internal).
    closed = invoke(["wait-ready", "prefill", "--timeout", "0", "--probe-timeout", "0.2"], tmp_path)
    assert closed.exit_code == Exit.PROBLEMS and "not ready after 0 s" in closed.output


def test_a_dry_run_that_cannot_observe_the_host_exits_4(tmp_path):
    missing = tmp_path / "no-such-systemctl"
    result = invoke(["cutover", "pd", "--dry-run", "--systemctl", str(missing)], tmp_path)
    assert result.exit_code == Exit.UNKNOWN, result.output
    assert "state unknown" in result.output


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_real_entry_point_exits_by_the_same_table(tmp_path, command):
    args = [a.replace("{file}", str(broken_toml(tmp_path))).replace("{out}", str(tmp_path / "out"))
            for a in COMMANDS[command]]
    done = subprocess.run([sys.executable, "-m", "pdserve.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == Exit.PROBLEMS, done.stderr
    assert "is not valid TOML" in done.stderr and "Traceback" not in done.stderr


def test_help_prints_the_exit_code_table():
    text = CliRunner().invoke(main, ["--help"], terminal_width=200).output
    for code, meaning in TABLE:
        assert f"  {int(code)}  {meaning}" in text, text


def test_the_commands_page_has_the_same_exit_code_table():
    page = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    for code, meaning in TABLE:
        assert f"| {int(code)} | {meaning} |" in page


def _commands() -> dict[str, click.Command]:
    with click.Context(main) as ctx:
        return {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}


def test_short_help_is_whole_and_metavars_say_what_they_are():
    listing = CliRunner().invoke(main, ["--help"], terminal_width=100).output
    commands = listing.split("Commands:")[1].split("Exit codes")[0]
    assert "..." not in commands, commands
    for name in _commands():
        text = CliRunner().invoke(main, [name, "--help"], terminal_width=100).output
        for vague in ("TEXT", "FLOAT RANGE", "INTEGER RANGE", "FLOAT", "INTEGER", "DIRECTORY", "[PD|SINGLE]",
                      "[PREFILL|DECODE|ROUTER|FALLBACK]"):
            assert not re.search(rf"(?<![A-Za-z_]){re.escape(vague)}(?![A-Za-z_])", text), (name, vague, text)


def test_every_command_with_a_deployment_has_the_one_config_option():
    from pdserve.cli.options import config_option

    @config_option
    def probe(config_path):  # the shared option, as click records it on a function
        return config_path

    shared = probe.__click_params__[0]
    for name, command in _commands().items():
        options = [p for p in command.params if "--config" in getattr(p, "opts", [])]
        if name == "schema":
            assert options == []
            continue
        (option,) = options
        assert (option.opts, option.metavar, option.help) == (shared.opts, shared.metavar, shared.help), name


def test_the_verifiers_exit_codes_are_the_command_lines():
    """verify, like cutover, cannot import pdserve.cli (a layer above it): its own numbers, which its
    --json report publishes as exit_code, must be the table's."""
    from pdserve.verify import report

    assert (report.EXIT_OK, report.EXIT_FAILED, report.EXIT_USAGE, report.EXIT_BROKEN) == (
        Exit.OK, Exit.PROBLEMS, Exit.USAGE, Exit.INTERNAL)
