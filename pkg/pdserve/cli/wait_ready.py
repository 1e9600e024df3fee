"""`pdserve wait-ready ROLE`: the units' readiness gate (ExecStartPost=, ExecStartPre=), over
pdserve.launch.gate."""

from __future__ import annotations

import os
from pathlib import Path

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, load_or_exit, seconds_option
from pdserve.schema.config import ROLES, Role

ROLE_CHOICE = click.Choice(ROLES)


@click.command("wait-ready", short_help=short_help("wait-ready"))
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
def wait_ready(role: Role, config_path: Path | None, timeout: float, interval: float, probe_timeout: float,
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
            placed = gate_server(dep, role, server) if warm_up else None
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
