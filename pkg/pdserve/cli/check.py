"""`pdserve check`: every problem of one or more deployment files at once, and of this host where it is
the target (pdserve.check)."""

from __future__ import annotations

from pathlib import Path

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, print_problems, tool_options, tool_overrides
from pdserve.render.renderable import load_renderable
from pdserve.schema import strict_json
from pdserve.schema.problems import ConfigError, Problem, errors


@click.command("check", short_help=short_help("check"))
@config_option
@click.argument("more_configs", metavar="[FILE]...", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--host/--no-host", "host", default=None,
              help="Check this host (GPUs, NUMA nodes, tools, the SGLang Python's sglang version, files), or "
                   "not. Default: only on a host that looks like the target (see above).")
@click.option("--no-parsers", is_flag=True,
              help="Skip running the rendered argv through SGLang's and the router's parsers.")
@tool_options
def check(config_path: Path | None, more_configs: tuple[Path, ...], as_json: bool, host: bool | None,
          no_parsers: bool, sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    """Validate deployments: every problem at once, one line each (field, value, what is wrong, fix).

    With several files (-c A B C, or A B C), each is checked and then all of them together, as deployments
    of one host: no two may share a listening port or a unit name.

    Host checks run with --host, never with --no-host, and otherwise only where this host looks like the
    target: systemd is running, and the NVIDIA GPUs and NUMA nodes the file names exist here. The report
    says which rule applied.
    """
    from pdserve.check.run import run_check

    paths: list[Path | None] = [*([config_path] if config_path else []), *more_configs] or [None]
    overrides = tool_overrides(sglang_python, numactl, pdserve)
    reports = [run_check(path, overrides, parsers=not no_parsers, host=host) for path in paths]
    across = _check_across(paths) if len(paths) > 1 else []
    valid = all(report.valid for report in reports) and not errors(across)
    if as_json:
        data = (reports[0].as_dict() if len(reports) == 1 else
                {"schema_version": reports[0].as_dict()["schema_version"], "valid": valid,
                 "deployments": [report.as_dict() for report in reports], "across": [p.as_dict() for p in across]})
        click.echo(strict_json.dumps(data, indent=2))
    else:
        for report in reports:
            print_problems(report.problems)
            if report.host_rule:
                click.echo(f"host checks: {report.host_rule}", err=True)
            for reason in report.skipped:
                click.echo(f"skipped: {reason}", err=True)
            click.echo(report.summary())
        if len(paths) > 1:
            print_problems(across)
            click.echo(f"{len(paths)} deployments together: {'valid' if not errors(across) else 'invalid'} "
                       f"({len(errors(across))} collision(s) of ports or unit names)")
    raise SystemExit(Exit.OK if valid else Exit.PROBLEMS)


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
