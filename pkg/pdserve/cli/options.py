"""What every pdserve command shares: the `-c/--config` option, the tool options, and one way to read a
deployment or exit with its problems (Exit.PROBLEMS, whatever the command)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from pdserve.cli.exits import Exit
from pdserve.render.renderable import load_renderable
from pdserve.schema.loading import Loaded
from pdserve.schema.problems import ConfigError, Problem

config_option = click.option(
    "-c", "--config", "config_path", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False),
    help="Deployment file (.toml or .json). Default: the embedded reference deployment (dsv4).",
)

# (flag, metavar, help): flags beat the deployment's tools section.
_TOOL_FLAGS = (
    ("sglang-python", "PYTHON", "Python with sglang and the router, smg (default: tools.sglang_python, else "
                                "tools.sglang_venv/bin/python; never guessed from PATH)"),
    ("numactl", "PATH", "numactl executable (default: tools.numactl, then PATH)"),
    ("pdserve", "PATH", "pdserve executable for readiness gates (default: tools.pdserve, then PATH)"),
)


def tool_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--sglang-python, --numactl and --pdserve, passed to the command as sglang_python, numactl and pdserve
    (tool_overrides makes them the one dict the toolchain reads)."""
    for flag, metavar, help_text in reversed(_TOOL_FLAGS):
        command = click.option(f"--{flag}", flag.replace("-", "_"), metavar=metavar, help=help_text)(command)
    return command


def seconds_option(flag: str, default: float, minimum: float, help_text: str) -> Callable[..., Any]:
    """A duration option: SECONDS, at least `minimum`, its default shown."""
    return click.option(flag, metavar="SECONDS", type=click.FloatRange(min=minimum), default=default,
                        show_default=True, help=help_text)


def tool_overrides(sglang_python: str | None, numactl: str | None, pdserve: str | None) -> dict[str, str | None]:
    return {"sglang_python": sglang_python, "numactl": numactl, "pdserve": pdserve}


def print_problems(problems: list[Problem]) -> None:
    for problem in problems:
        click.echo(problem.line(), err=True)


def exit_with(problems: list[Problem]) -> NoReturn:
    """Print every problem, one line each, and end the command with Exit.PROBLEMS."""
    print_problems(problems)
    raise SystemExit(Exit.PROBLEMS)


def load_or_exit(config_path: Path | None, *, print_warnings: bool = True) -> Loaded:
    """The deployment fit to render, its warnings printed (unless the command reports them itself); or
    every problem of it and Exit.PROBLEMS."""
    try:
        loaded = load_renderable(config_path)
    except ConfigError as exc:
        exit_with(exc.problems)
    if print_warnings:
        print_problems(loaded.warnings)
    return loaded
