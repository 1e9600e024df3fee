"""The `pdserve` command line: a thin layer over the pure core.

Exit codes: 0 success, 1 the deployment (or the thing checked) is not right, 2 usage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from pdserve import __version__
from pdserve.render.renderable import load_renderable
from pdserve.schema.config import Deployment
from pdserve.schema.loading import Loaded, json_schema
from pdserve.schema.problems import ConfigError, Problem, errors

EXIT_INVALID = 1

config_option = click.option(
    "-c", "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
    help="Deployment file (.toml or .json). Default: the embedded reference deployment (dsv4).",
)


def tool_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for name, help_text in reversed([
        ("sglang-python", "Python with sglang and sglang-router (default: tools.sglang_python, then python3 on PATH)"),
        ("numactl", "numactl executable (default: tools.numactl, then PATH)"),
        ("pdserve", "pdserve executable for readiness gates (default: tools.pdserve, then PATH)"),
    ]):
        command = click.option(f"--{name}", name.replace("-", "_"), help=help_text)(command)
    return command


def _overrides(sglang_python: str | None, numactl: str | None, pdserve: str | None) -> dict[str, str | None]:
    return {"sglang_python": sglang_python, "numactl": numactl, "pdserve": pdserve}


def _print_problems(problems: list[Problem]) -> None:
    for problem in problems:
        click.echo(problem.line(), err=True)


def _load_or_exit(config_path: Path | None) -> Loaded:
    try:
        loaded = load_renderable(config_path)
    except ConfigError as exc:
        _print_problems(exc.problems)
        raise SystemExit(EXIT_INVALID) from None
    _print_problems(loaded.warnings)
    return loaded


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pdserve")
def main() -> None:
    """Deploy an SGLang model as a prefill/decode disaggregated service, and prove it works."""


@main.command()
@config_option
@tool_options
def plan(config_path: Path | None, sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    """Show what would run: topology, exact commands, environment and unit files."""
    from pdserve.render.plan import print_plan
    from pdserve.render.toolchain import preview_toolchain
    from pdserve.render.units import render_units

    loaded = _load_or_exit(config_path)
    dep = loaded.deployment
    tools, notes = preview_toolchain(dep, _overrides(sglang_python, numactl, pdserve))
    try:
        units = render_units(dep, tools, default_config_path(dep, Path("/etc/systemd/system")))
    except ConfigError as exc:  # e.g. a previewed tool path systemd cannot execute
        _print_problems(exc.problems)
        raise SystemExit(EXIT_INVALID) from None
    print_plan(Console(), dep, tools, units, notes)


@main.command()
@config_option
@click.argument("more_configs", metavar="[FILE]...", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--no-host", is_flag=True, help="Skip the checks of this host (GPUs, NUMA nodes, files).")
@click.option("--no-parsers", is_flag=True, help="Skip running the rendered argv through SGLang's and the router's parsers.")
@tool_options
def check(config_path: Path | None, more_configs: tuple[Path, ...], as_json: bool, no_host: bool, no_parsers: bool,
          sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    """Validate a deployment; exit 0 valid, 1 invalid, 2 usage.

    With several files (-c A B C, or A B C), each is checked and then all of them together, as deployments
    of one host: no two may share a listening port or a unit name.
    """
    from pdserve.check.run import run_check

    paths: list[Path | None] = [*([config_path] if config_path else []), *more_configs] or [None]
    overrides = _overrides(sglang_python, numactl, pdserve)
    reports = [run_check(path, overrides, parsers=not no_parsers, host=not no_host) for path in paths]
    across = _check_across(paths) if len(paths) > 1 else []
    valid = all(report.valid for report in reports) and not errors(across)
    if as_json:
        data = (reports[0].as_dict() if len(reports) == 1 else
                {"schema_version": reports[0].as_dict()["schema_version"], "valid": valid,
                 "deployments": [report.as_dict() for report in reports], "across": [p.as_dict() for p in across]})
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        for report in reports:
            _print_problems(report.problems)
            for reason in report.skipped:
                click.echo(f"skipped: {reason}", err=True)
            click.echo(report.summary())
        if len(paths) > 1:
            _print_problems(across)
            click.echo(f"{len(paths)} deployments together: {'valid' if not errors(across) else 'invalid'} "
                       f"({len(errors(across))} collision(s) of ports or unit names)")
    raise SystemExit(0 if valid else EXIT_INVALID)


def _check_across(paths: list[Path | None]) -> list[Problem]:
    """Deployments that do not load are reported by their own check; the rest are checked together."""
    from pdserve.schema.rules_across import validate_across

    deployments = []
    for path in paths:
        try:
            deployments.append(load_renderable(path).deployment)
        except ConfigError:
            continue
    return validate_across(deployments)


def default_config_path(dep: Deployment, out: Path) -> str:
    return str((out / f"pdserve-{dep.name}.json").absolute())


def _render(config_path: Path | None, out_dir: Path, runtime_config: str | None,
            sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    from pdserve.render.toolchain import resolve_toolchain
    from pdserve.render.units import render_units

    dep = _load_or_exit(config_path).deployment
    target_config = runtime_config or default_config_path(dep, out_dir)
    try:
        tools = resolve_toolchain(dep, _overrides(sglang_python, numactl, pdserve))
        units = render_units(dep, tools, target_config)
    except ConfigError as exc:
        _print_problems(exc.problems)
        raise SystemExit(EXIT_INVALID) from None
    # Write everything to temporary names first, then rename: a failed render leaves nothing half written.
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {unit.filename: unit.text for unit in units}
    files[f"pdserve-{dep.name}.json"] = dep.model_dump_json(indent=2) + "\n"
    staged = []
    try:
        for name, text in files.items():
            tmp = out_dir / f".{name}.pdserve-tmp"
            tmp.write_text(text, encoding="utf-8")
            staged.append((tmp, out_dir / name))
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        click.echo(f"error: cannot write into {out_dir}: {exc.strerror}; fix: choose a writable --out", err=True)
        raise SystemExit(EXIT_INVALID) from None
    for tmp, final in staged:
        tmp.replace(final)
        click.echo(str(final))


@main.command("render")
@config_option
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for the unit files (e.g. /etc/systemd/system).")
@click.option("--config-path", "runtime_config",
              help="Where the units read the deployment at run time (default: the pdserve-<name>.json written into --out).")
@tool_options
def render_command(config_path: Path | None, out_dir: Path, runtime_config: str | None,
                   sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    """Write the unit files and the deployment JSON they read."""
    _render(config_path, out_dir, runtime_config, sglang_python, numactl, pdserve)


@main.command()
def schema() -> None:
    """Print the deployment's JSON Schema."""
    click.echo(json.dumps(json_schema(), indent=2, sort_keys=True))


@main.command("wait-ready")
@click.argument("role", type=click.Choice(["prefill", "decode", "router", "fallback"]))
@config_option
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds to wait before giving up.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between probes.")
@click.option("--probe-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds each HTTP request may take.")
def wait_ready(role: str, config_path: Path | None, timeout: float, interval: float, probe_timeout: float) -> None:
    """Wait until ROLE answers as ready; exit 1 with the last state seen when the deadline passes."""
    import httpx

    from pdserve.launch.gate import probe_for, wait_until_ready
    from pdserve.schema.derived import unit_name

    dep = _load_or_exit(config_path).deployment
    with httpx.Client(timeout=probe_timeout) as client:
        result = wait_until_ready(
            probe_for(dep, role, client), timeout, interval,
            on_change=lambda o: click.echo(f"{role}: {o.state}", err=True),
        )
    if result.ready:
        click.echo(f"{unit_name(dep, role)} ready: {result.state}")
        return
    click.echo(f"error: {unit_name(dep, role)} not ready after {timeout:g} s; last state: {result.state}; "
               f"fix: read `journalctl -u {unit_name(dep, role)}`", err=True)
    raise SystemExit(EXIT_INVALID)


# `pdserve cutover pd|single` (pkg/pdserve/cutover/).
from pdserve.cli.cutover import cutover_command  # noqa: E402

main.add_command(cutover_command)


# `pdserve verify`: prove a running deployment works (pkg/pdserve/verify/).
from pdserve.cli.verify import verify as verify_command  # noqa: E402

main.add_command(verify_command)


if __name__ == "__main__":
    main(sys.argv[1:])
