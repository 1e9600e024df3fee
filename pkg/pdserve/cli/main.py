"""The `pdserve` command line: a thin layer over the pure core.

Every command exits by one table (pdserve.cli.exits, printed by `pdserve --help`): a deployment file
with problems is Exit.PROBLEMS from every command, a wrong command line is click's Exit.USAGE, and an
exception that escapes a command is Exit.INTERNAL with its reason, never a traceback or a pass.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from pdserve import __version__
from pdserve.cli.exits import Exit, help_epilog
from pdserve.cli.options import (
    config_option,
    exit_with,
    load_or_exit,
    print_problems,
    seconds_option,
    tool_options,
    tool_overrides,
)
from pdserve.render.renderable import load_renderable
from pdserve.schema import strict_json
from pdserve.schema.config import ROLES
from pdserve.schema.loading import json_schema
from pdserve.schema.problems import ConfigError, Problem, errors

ROLE_CHOICE = click.Choice(ROLES)


class Commands(click.Group):
    """click's group, with Exit.INTERNAL for an exception that escapes a command: what broke, not a
    traceback, and never an exit code that reads as success or as a problem of the deployment."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort,
                SystemExit, KeyboardInterrupt):
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `pdserve plan | head`: click's own handling of a closed pipe
                raise
            _internal(ctx, exc)
        except Exception as exc:  # noqa: BLE001 - the contract is Exit.INTERNAL with the reason
            _internal(ctx, exc)


def _internal(ctx: click.Context, exc: BaseException) -> None:
    command = ctx.invoked_subcommand or "pdserve"
    click.echo(f"pdserve {command}: internal error: {type(exc).__name__}: {exc}; this is a bug in pdserve "
               f"(exit {int(Exit.INTERNAL)})", err=True)
    raise SystemExit(Exit.INTERNAL) from None


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]}, epilog=help_epilog())
@click.version_option(__version__, prog_name="pdserve")
def main() -> None:
    """Deploy an SGLang model as a prefill/decode disaggregated service, and prove it works."""


@main.command(short_help="Show what would run: topology, commands, environment, units.")
@config_option
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON, for machines.")
@click.option("--host", "host", metavar="NAME", help="Multi-host deployments: the host whose plan to show.")
@tool_options
def plan(config_path: Path | None, as_json: bool, host: str | None, sglang_python: str | None, numactl: str | None,
         pdserve: str | None) -> None:
    """Show what would run: topology, exact commands, environment and unit files.

    On a terminal: tables and panels. Piped or redirected: plain shell to copy from (each command quoted
    so the shell gives back its exact argv, the environment as KEY=value lines, the unit files as
    here-documents, the rest as # comments). --json: the same content for machines. A multi-host
    deployment is shown one host at a time (--host), its firewall ruleset included.
    """
    from pdserve.render.firewall import render_firewall
    from pdserve.render.host_units import render_host_units
    from pdserve.render.plan import host_plan_data, plain_text, plan_data, print_rich
    from pdserve.render.toolchain import preview_toolchain
    from pdserve.render.units import render_units

    loaded = load_or_exit(config_path)
    dep = loaded.deployment
    chosen = chosen_host(dep, host)
    tools, notes = preview_toolchain(dep, tool_overrides(sglang_python, numactl, pdserve))
    runtime = default_config_path(dep, Path("/etc/systemd/system"))
    try:
        units = render_host_units(dep, chosen, tools, runtime) if chosen else render_units(dep, tools, runtime)
    except ConfigError as exc:  # e.g. a previewed tool path systemd cannot execute
        exit_with(exc.problems)
    data = (host_plan_data(dep, chosen, tools, units, notes, loaded.source, render_firewall(dep, chosen)) if chosen
            else plan_data(dep, tools, units, notes, loaded.source))
    if as_json:
        click.echo(strict_json.dumps(data, indent=2))
    elif sys.stdout.isatty():
        print_rich(Console(), data)
    else:
        click.echo(plain_text(data), nl=False)


@main.command(short_help="Validate deployment files (and this host, where it is the target).")
@config_option
@click.argument("more_configs", metavar="[FILE]...", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--host/--no-host", "host", default=None,
              help="Check this host (GPUs, NUMA nodes, tools, the SGLang Python's sglang version, files), or "
                   "not. Default: only on a host that looks like the target (see above).")
@click.option("--no-parsers", is_flag=True, help="Skip running the rendered argv through SGLang's and the router's parsers.")
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


@main.command(short_help="Print the deployment's JSON Schema.")
def schema() -> None:
    """Print the deployment's JSON Schema."""
    click.echo(strict_json.dumps(json_schema(), indent=2, sort_keys=True))


@main.command("wait-ready", short_help="Wait until ROLE answers as ready (the units' gate).")
@click.argument("role", metavar="ROLE", type=ROLE_CHOICE)
@config_option
@seconds_option("--timeout", 600.0, 0, "Seconds to wait before giving up; no request outlasts them.")
@seconds_option("--interval", 2.0, 0.05, "Seconds between probes.")
@seconds_option("--probe-timeout", 10.0, 0.1, "Seconds each HTTP request may take (the whole exchange).")
@click.option("--server", metavar="NAME", help="Multi-host deployments: which of the role's servers (prefill-1, "
              "decode-2, ...); it is reached at its host's cluster address.")
@click.option("--warm-up", "warm_up", is_flag=True, help="prefill/decode: once ready, send one real KV hand-off "
              "through the server and a server of the other role, then hand it back to the routers "
              "(`pdserve leave-routers` took it out); all within --timeout.")
@seconds_option("--handoff-timeout", 60.0, 1.0, "Seconds each warm-up /generate may take (the first KV transfer "
                "after a start stalls for seconds).")
@seconds_option("--peer-wait", 60.0, 0, "Seconds the warm-up waits for a server of the other role to be ready; "
                "then the server goes back to the routers unwarmed, said in the journal.")
def wait_ready(role: str, config_path: Path | None, timeout: float, interval: float, probe_timeout: float,
               server: str | None, warm_up: bool, handoff_timeout: float, peer_wait: float) -> None:
    """Wait until ROLE (prefill, decode, router or fallback) answers as ready; exit 1 with the last state
    seen when the deadline passes. Run as ExecStartPost=, it exits 1 at once when the unit's main process
    ($MAINPID) exits, so systemd restarts the unit instead of waiting out the deadline."""
    import time

    from pdserve.launch.gate import LAST_PROBE_S, probe_for, wait_until_ready, watched
    from pdserve.launch.main_process import MainProcessGone, watched_sleep
    from pdserve.launch.warm import gate_server, warm_and_rejoin
    from pdserve.probes import http
    from pdserve.schema.derived import unit_name

    if warm_up and role not in ("prefill", "decode"):
        raise click.BadParameter(f"only a prefill or decode server is warmed, not the {role}", param_hint="--warm-up")
    dep = load_or_exit(config_path).deployment
    unit = f"sglang-{dep.name}-{server}" if server and role != "router" else unit_name(dep, role)
    main_process = _main_process_or_exit()
    began = time.monotonic()

    def say(text: str) -> None:
        click.echo(f"{server or role}: {text}", err=True)

    # Each request ends by --probe-timeout (a warm-up /generate by --handoff-timeout) and none outlasts
    # --timeout (but the probe at the deadline, which gets LAST_PROBE_S), so the gate ends within
    # --timeout + LAST_PROBE_S whatever a server does.
    not_after = began + timeout + LAST_PROBE_S
    with http.client(probe_timeout, not_after=not_after) as client, \
            http.client(handoff_timeout, not_after=not_after) as handoff_client:
        try:
            probe = probe_for(dep, role, client, server)
            placed = gate_server(dep, role, server) if warm_up else None  # type: ignore[arg-type]
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--server") from None
        try:
            result = wait_until_ready(
                watched(probe, main_process), timeout, interval, sleep=watched_sleep(main_process),
                on_change=lambda o: say(o.state),
            )
            if result.ready and placed is not None:
                result = warm_and_rejoin(dep, placed, client, handoff_client, began + timeout, interval, peer_wait,
                                         sleep=watched_sleep(main_process), say=say)
        except MainProcessGone as gone:
            click.echo(f"error: {unit}: {gone}; the gate stops now so that systemd restarts the unit "
                       f"(Restart=on-failure) instead of waiting out --timeout; fix: read `journalctl -u {unit}` "
                       "for why it exited", err=True)
            raise SystemExit(Exit.PROBLEMS) from None
    if result.ready:
        click.echo(f"{unit} ready: {result.state}")
        return
    where = " on its host" if dep.multi_host else ""
    click.echo(f"error: {unit} not ready after {timeout:g} s; last state: {result.state}; "
               f"fix: read `journalctl -u {unit}`{where}", err=True)
    raise SystemExit(Exit.PROBLEMS)


@main.command("leave-routers", short_help="Take a prefill/decode server out of the routers (its unit's first step).")
@click.argument("role", metavar="ROLE", type=click.Choice(["prefill", "decode"]))
@config_option
@click.option("--server", metavar="NAME", help="Multi-host deployments: which of the role's servers.")
@seconds_option("--timeout", 10.0, 0.5, "Seconds to wait for the routers; no request outlasts them.")
def leave_routers_command(role: str, config_path: Path | None, server: str | None, timeout: float) -> None:
    """Remove ROLE's server from every router this host reaches (smg's DELETE /workers/ID), so that no
    router sends it requests before `wait-ready --warm-up` has warmed it and handed it back. Run as the
    worker unit's ExecStartPre=. A router that is not running has nothing to remove; one that keeps the
    server is reported, and the exit status is 0 all the same: the server must start either way."""
    import time

    from pdserve.launch.warm import gate_server, leave_routers
    from pdserve.probes import http

    dep = load_or_exit(config_path).deployment
    try:
        placed = gate_server(dep, role, server)  # type: ignore[arg-type]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--server") from None
    with http.client(min(timeout, 5.0), not_after=time.monotonic() + timeout) as client:
        kept = not leave_routers(dep, placed, client, timeout,
                                 lambda text: click.echo(f"{placed.name}: {text}", err=True))
    if kept:
        click.echo(f"warning: a router kept {placed.name}; it takes it back on its own health check, before the "
                   "warm-up, so a client may meet SGLang's first-transfer stall", err=True)


def _main_process_or_exit():
    """The unit's main process when systemd named one ($MAINPID: the gate runs as ExecStartPost=), else None."""
    from pdserve.launch.main_process import BadMainPid, MainProcess, main_pid_from

    try:
        pid = main_pid_from(os.environ)
    except BadMainPid as exc:
        click.echo(f"error: {exc}; systemd sets it to the unit's main PID, unset it to run the gate by hand",
                   err=True)
        raise SystemExit(Exit.USAGE) from None
    return None if pid is None else MainProcess.open(pid)


# `pdserve render` (pdserve.cli.render).
from pdserve.cli.render import chosen_host, default_config_path, render_command  # noqa: E402

main.add_command(render_command)


# `pdserve cutover pd|single` (pkg/pdserve/cutover/).
from pdserve.cli.cutover import cutover_command  # noqa: E402

main.add_command(cutover_command)


# `pdserve verify`: prove a running deployment works (pkg/pdserve/verify/).
from pdserve.cli.verify import verify as verify_command  # noqa: E402

main.add_command(verify_command)


if __name__ == "__main__":
    main(sys.argv[1:])
