"""`pdserve cutover pd|single`: the command line around the cutover state machine.

Exit codes (pdserve.cli.exits): 0 success (or already serving), 1 failed and rolled back, refused by
preflight (nothing changed), or the deployment file has problems; 2 usage; 3 the rollback failed too;
4 a dry run that could not read which units run (state unknown).
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, load_or_exit
from pdserve.cutover.machine import Cutover
from pdserve.cutover.plan import Plan, plan_for
from pdserve.cutover.refusals import PortProber
from pdserve.cutover.report import DRY_RUNS, Report
from pdserve.probes.systemctl import Systemctl
from pdserve.schema import strict_json

SCHEMA_VERSION = 1


@contextmanager
def termination_interrupts(signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Make SIGTERM and SIGHUP (systemd, `timeout`, a closed terminal, an operator's kill) interrupt the
    cutover the way Ctrl-C does: the step in flight fails and the rollback runs, instead of the process
    dying with the host half switched."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def probers(plan: Plan) -> list[PortProber]:
    """One prober per public address (the fallback normally takes the router's, so usually one)."""
    seen: dict[tuple[str, int], PortProber] = {}
    for layout in (plan.target, plan.other):
        parts = urlsplit(plan.public_url[layout])
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        seen.setdefault(key, PortProber(*key))
    return list(seen.values())


def acts_locally(command: list[str]) -> bool:
    """Whether the systemctl command acts on the unit files this process sees: systemctl itself with
    options, not a wrapper that enters a container, nor `--root=`/`--host=`/`--machine=`."""
    elsewhere = ("--root", "-H", "--host", "-M", "--machine")
    return (bool(command) and Path(command[0]).name == "systemctl"
            and not any(arg.split("=", 1)[0] in elsewhere for arg in command[1:]))


def report_lines(report: Report) -> list[str]:
    """The timeline as plain lines: readable in a terminal, a journal and a CI log alike."""
    lines = [f"cutover of {report.deployment}: {report.previous_label} -> {report.target}"]
    if report.outcome in DRY_RUNS:
        lines += [f"  {i}. {s.name}: {s.detail}" for i, s in enumerate(report.steps, 1)]
        lines.append("dry run: nothing was changed")
        if report.state_unknown:
            lines.append(f"state unknown (exit {report.exit_code}): which units run could not be read: "
                         f"{report.state_unknown}")
        return lines
    lines.append(f"  {'at s':>6}  {'took s':>6}  {'result':<7}  step")
    for step in report.steps:
        lines.append(f"  {step.started_s:6.1f}  {step.duration_s:6.1f}  {step.result:<7}  {step.name}: {step.detail}")
    for refusal in report.refusals:
        windows = ", ".join(f"{a:.1f}-{b:.1f} s" for a, b in refusal.windows) or "none"
        lines.append(f"public port {refusal.address} refused connections for {refusal.refused_seconds:.1f} s "
                     f"(windows: {windows}; {refusal.refused_samples} of {refusal.samples} probes refused)")
    if report.boot is not None:
        lines += report.boot.lines()
    lines.append(f"{report.outcome} after {report.total_s:.1f} s (exit {report.exit_code})")
    return lines


@click.command("cutover", short_help=short_help("cutover"))
@click.argument("target", metavar="TARGET", type=click.Choice(["pd", "single"]))
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--dry-run", is_flag=True, help="Print the steps (and what is running now) without doing them; "
              "exit 4 (state unknown) when what is running cannot be read.")
@click.option("--systemctl", "systemctl_command", metavar="COMMAND", default="systemctl", show_default=True,
              help="systemctl command to drive, e.g. 'systemctl --root=...' or a wrapper that enters a container.")
@click.option("--host", "host", metavar="NAME", default=None,
              help="Multi-host deployments: the host this runs on; only its units are cut over (default: the host "
                   "whose cluster address this machine has). The order across hosts: --dry-run.")
def cutover_command(target: str, config_path: Path | None, as_json: bool, dry_run: bool, systemctl_command: str,
                    host: str | None) -> None:
    """Move the deployment to TARGET (pd or single) with a way back: stop, start, wait ready, smoke, enable.

    Boot links change only where this host lets them be written (not on NixOS); either way the report
    names the boot_layout line to change. A boot-link problem never fails a cutover that serves.
    Exit 0 success, 1 failed and rolled back (or refused, or the file has problems), 2 usage, 3 the
    rollback failed too, 4 a dry run that could not read which units run.
    """
    from pdserve.cutover.host import HostEdge

    loaded = load_or_exit(config_path, print_warnings=False)  # the report carries them
    dep = loaded.deployment
    warnings = [p.line() for p in loaded.warnings]
    if dep.multi_host:
        plan = _host_plan_or_exit(dep, target, host, dry_run, as_json, config_path, warnings, loaded.source)
    elif host is not None:
        raise click.UsageError(f"--host {host}: deployment {dep.name} describes one host (no [hosts]); leave it out")
    else:
        plan = plan_for(dep, target, warnings, loaded.source)  # type: ignore[arg-type]
    command = shlex.split(systemctl_command)
    edge = HostEdge(dep, plan, Systemctl(command), acts_locally(command))
    # One host of several probes the public port only where its router runs.
    machine = Cutover(plan, edge, probers(plan) if not plan.host or plan.fronts["pd"] else [])
    with termination_interrupts():
        report = machine.dry_run() if dry_run else machine.run()
    if as_json:
        one_host = {"host": plan.host} if plan.host else {}  # one host's step of a multi-host deployment
        click.echo(strict_json.dumps({"schema_version": SCHEMA_VERSION, **one_host, **report.as_dict()}, indent=2))
    else:
        click.echo("\n".join(report_lines(report)))
    if report.outcome not in DRY_RUNS or report.exit_code:
        raise SystemExit(report.exit_code)


def _host_plan_or_exit(dep, target: str, host: str | None, dry_run: bool, as_json: bool, config_path: Path | None,
                       warnings: list[str], source: str) -> Plan:
    """One host's plan of a multi-host cutover; or the order across hosts and the exit, when this run
    cannot act (no fallback to cut over to; no host named and none with this machine's address)."""
    from dataclasses import asdict

    from pdserve.cutover.order import NO_FALLBACK, UnknownHost, order, order_lines, this_host
    from pdserve.probes import net

    config = str(config_path) if config_path else "FILE"
    if target == "single":
        click.echo(f"pdserve cutover single: {NO_FALLBACK}", err=True)
        raise SystemExit(Exit.PROBLEMS)
    try:
        here = this_host(dep, host, net.host_addresses() if host is None else [])
    except UnknownHost as exc:
        raise click.UsageError(str(exc)) from None
    if here is None or (dry_run and host is None):
        refused = here is None and not dry_run
        if as_json:
            click.echo(strict_json.dumps({"schema_version": SCHEMA_VERSION, "deployment": dep.name, "target": "pd",
                                   "outcome": "refused-by-preflight" if refused else "dry-run",
                                   "order": [asdict(step) for step in order(dep, config)]}, indent=2))
        else:
            click.echo("\n".join(order_lines(dep, config)))
            if here is None:
                click.echo(f"no host of {dep.name} has this machine's address: pass --host NAME (one of "
                           f"{', '.join(dep.hosts)}) to cut over that host's units here; nothing was changed")
        raise SystemExit(Exit.PROBLEMS if refused else Exit.OK)
    if dry_run and not as_json:
        click.echo("\n".join(order_lines(dep, config)))
    return plan_for(dep, "pd", warnings, source, host=here)
