"""`pdserve wait-ready ROLE`: the units' readiness gate (ExecStartPost=, ExecStartPre=), over
pdserve.launch.gate."""

from __future__ import annotations

from pathlib import Path

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, load_or_exit, seconds_option
from pdserve.schema.config import ROLES

ROLE_CHOICE = click.Choice(ROLES)


@click.command("wait-ready", short_help=short_help("wait-ready"))
@click.argument("role", metavar="ROLE", type=ROLE_CHOICE)
@config_option
@seconds_option("--timeout", 600.0, 0, "Seconds to wait before giving up; no request outlasts them.")
@seconds_option("--interval", 2.0, 0.05, "Seconds between probes.")
@seconds_option("--probe-timeout", 10.0, 0.1, "Seconds each HTTP request may take (the whole exchange).")
@click.option("--server", metavar="NAME", help="Multi-host deployments: which of the role's servers (prefill-1, "
              "decode-2, ...); it is reached at its host's cluster address.")
def wait_ready(role: str, config_path: Path | None, timeout: float, interval: float, probe_timeout: float,
               server: str | None) -> None:
    """Wait until ROLE (prefill, decode, router or fallback) answers as ready; exit 1 with the last state
    seen when the deadline passes."""
    import time

    from pdserve.launch.gate import LAST_PROBE_S, probe_for, wait_until_ready
    from pdserve.probes import http
    from pdserve.schema.derived import unit_name

    dep = load_or_exit(config_path).deployment
    unit = f"sglang-{dep.name}-{server}" if server and role != "router" else unit_name(dep, role)
    # Each request ends by --probe-timeout and none outlasts --timeout (but the probe at the deadline, which
    # gets LAST_PROBE_S), so the wait ends within --timeout + LAST_PROBE_S whatever a server does.
    with http.client(probe_timeout, not_after=time.monotonic() + timeout + LAST_PROBE_S) as client:
        try:
            probe = probe_for(dep, role, client, server)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--server") from None
        result = wait_until_ready(
            probe, timeout, interval,
            on_change=lambda o: click.echo(f"{server or role}: {o.state}", err=True),
        )
    if result.ready:
        click.echo(f"{unit} ready: {result.state}")
        return
    where = " on its host" if dep.multi_host else ""
    click.echo(f"error: {unit} not ready after {timeout:g} s; last state: {result.state}; "
               f"fix: read `journalctl -u {unit}`{where}", err=True)
    raise SystemExit(Exit.PROBLEMS)
