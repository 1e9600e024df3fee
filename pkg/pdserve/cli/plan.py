"""`pdserve plan`: what would run, in three views of one content (pdserve.render.plan)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pdserve.cli.commands import short_help
from pdserve.cli.options import config_option, exit_with, load_or_exit, tool_options, tool_overrides
from pdserve.cli.render import chosen_host, default_config_path
from pdserve.schema import strict_json
from pdserve.schema.problems import ConfigError


@click.command("plan", short_help=short_help("plan"))
@config_option
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON, for machines.")
@click.option("--host", "host", metavar="NAME", help="Multi-host deployments: the host whose plan to show.")
@tool_options
def plan(config_path: Path | None, as_json: bool, host: str | None, sglang_python: str | None, numactl: str | None,
         pdserve: str | None) -> None:
    """Show what would run: topology, exact commands, environment and unit files.

    On a terminal: tables and panels. Piped or redirected: plain shell to copy from (each role's command runs
    as pasted: `env NAME=value ...` and the argv, quoted so the program gets exactly the unit's argv and
    environment; the unit files as here-documents, the rest as # comments). --json: the same content for
    machines. A multi-host deployment is shown one host at a time (--host), its firewall ruleset included.
    """
    from pdserve.render.firewall import render_firewall
    from pdserve.render.plan import plain_text, plan_data, print_rich
    from pdserve.render.toolchain import preview_toolchain
    from pdserve.render.units import render_units
    from pdserve.schema.placement import IMPLIED_HOST

    loaded = load_or_exit(config_path)
    dep = loaded.deployment
    chosen = chosen_host(dep, host)
    tools, notes = preview_toolchain(dep, tool_overrides(sglang_python, numactl, pdserve))
    runtime = default_config_path(dep, Path("/etc/systemd/system"))
    try:
        units = render_units(dep, tools, runtime, chosen or IMPLIED_HOST)
    except ConfigError as exc:  # e.g. a previewed tool path systemd cannot execute
        exit_with(exc.problems)
    firewall = render_firewall(dep, chosen) if chosen else None  # a ruleset per host of a multi-host file only
    data = plan_data(dep, tools, units, notes, loaded.source, chosen or IMPLIED_HOST, firewall)
    if as_json:
        click.echo(strict_json.dumps(data, indent=2))
    elif sys.stdout.isatty():
        from rich.console import Console  # only a terminal gets rich's tables and panels

        print_rich(Console(), data)
    else:
        click.echo(plain_text(data), nl=False)
