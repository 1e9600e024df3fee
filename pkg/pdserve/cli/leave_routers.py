"""`pdserve leave-routers ROLE`: a prefill/decode unit's first step (ExecStartPre=), over pdserve.launch.warm:
the server leaves every router until its gate has warmed it (`wait-ready --warm-up`)."""

from __future__ import annotations

from pathlib import Path

import click

from pdserve.cli.commands import short_help
from pdserve.cli.options import config_option, load_or_exit, seconds_option


@click.command("leave-routers", short_help=short_help("leave-routers"))
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
