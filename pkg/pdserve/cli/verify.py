"""`pdserve verify`: the click command. Exits by pdserve.cli.exits: 0 all pass (warn/skip allowed),
1 a check failed or the deployment file has problems, 2 usage (bad flags, unknown check id), 3 the
verifier itself broke."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click
from rich.console import Console

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, load_or_exit, seconds_option
from pdserve.probes import http, net
from pdserve.verify import presence, report
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import HostChoiceError, checks_for, choose_host
from pdserve.verify.runner import Context, Options, SelectionError, run, select


def _tokens(values: tuple[str, ...]) -> list[str]:
    return [t.strip() for v in values for t in v.split(",") if t.strip()]


@click.command("verify", short_help=short_help("verify"))
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (stable, with schema_version).")
@click.option("--only", multiple=True, metavar="IDS",
              help="Run only these checks: comma-separated ids or id prefixes (e.g. e2e,kv.decode). Repeatable.")
@click.option("--skip", multiple=True, metavar="IDS", help="Do not run these checks (ids or prefixes). Repeatable.")
@seconds_option("--wait", 0.0, 0, "Re-run failing checks until they pass or SECONDS have passed.")
@seconds_option("--interval", 2.0, 0.1, "Seconds between --wait rounds.")
@seconds_option("--probe-timeout", 10.0, 0.1,
                "Seconds each HTTP request (the whole exchange: connect, headers, body), systemctl/journalctl call "
                "or connect attempt may take.")
@seconds_option("--chat-timeout", 180.0, 1, "Seconds each end-to-end chat request may take, a stream's every chunk "
                "included (a reasoning answer can be long).")
@click.option("--kv-floor", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="Least KV capacity (max_total_num_tokens) each server must have. "
                   "Default: model.context_length, else 65536.")
@click.option("--api-key-file", metavar="FILE", type=click.Path(dir_okay=False), default=None,
              help="Read the router's API key from this file instead of router.api_key_file.")
@click.option("--host", "host", metavar="NAME", default=None,
              help="Multi-host deployments: the host this run stands on, whose host-local checks (units, journal, "
                   "GPUs, NUMA, ports) it makes; the other hosts' are skipped, naming the host to run them on. "
                   "Default: the host whose cluster address this machine has, else the router's host.")
@click.option("--schema", "print_schema", is_flag=True, help="Print the JSON Schema of the --json report and exit.")
@click.option("--list", "list_checks", is_flag=True, help="List the check ids of the deployment and exit.")
def verify(config_path: Path | None, as_json: bool, only: tuple[str, ...], skip: tuple[str, ...], wait: float,
           interval: float, probe_timeout: float, chat_timeout: float, kv_floor: int | None,
           api_key_file: str | None, host: str | None, print_schema: bool, list_checks: bool) -> None:
    """Prove the running deployment works: units, router, KV capacity, GPUs, NUMA, end to end, exposure, versions."""
    if print_schema:
        click.echo(report.to_json(report.json_schema()))
        return
    loaded = load_or_exit(config_path, print_warnings=not list_checks)
    dep = loaded.deployment
    try:
        here = choose_host(dep, host, net.host_addresses() if dep.multi_host and host is None else [])
    except HostChoiceError as exc:
        raise click.UsageError(str(exc)) from None
    exp = expectations(dep, kv_floor, here.host)
    checks = checks_for(exp)
    if list_checks:
        click.echo("\n".join(checks))
        return
    try:
        plan = select(list(checks), _tokens(only), _tokens(skip))
    except SelectionError as exc:
        raise click.UsageError(str(exc)) from None
    rerun = "pdserve verify" + (f" -c {shlex.quote(str(config_path))}" if config_path else "")
    if dep.multi_host:
        Console(stderr=True).print(f"verifying {dep.name} from host {here.host} ({here.why})", style="dim",
                                   soft_wrap=True)
    try:
        code = _verify(loaded, exp, checks, plan, here.host, rerun, as_json, wait, interval, probe_timeout,
                       chat_timeout, api_key_file)
    except Exception as exc:  # noqa: BLE001 - the contract is exit 3, with the reason, not a traceback
        click.echo(f"pdserve verify: internal error: {type(exc).__name__}: {exc}; this is a bug in pdserve",
                   err=True)
        raise SystemExit(Exit.INTERNAL) from None
    raise SystemExit(code)


def _verify(loaded, exp, checks, plan, here, rerun, as_json, wait, interval, probe_timeout, chat_timeout,
            api_key_file) -> int:
    dep = loaded.deployment
    options = Options(probe_timeout=probe_timeout, chat_timeout=chat_timeout, api_key_file=api_key_file, rerun=rerun)
    started = time.monotonic()
    err = Console(stderr=True)

    def on_retry(pending: list[str], remaining: float) -> None:
        err.print(f"waiting: {len(pending)} failing ({', '.join(pending)}); {remaining:.0f} s left", style="dim")

    # Every request of the run completes within --probe-timeout, body included (the chat requests: within
    # --chat-timeout, on the openai client's own bounded client).
    with http.client(probe_timeout) as client:
        ctx = Context(dep, exp, options, client, here=here)
        results, broken = run(ctx, plan, wait=wait, interval=interval, checks=checks, on_retry=on_retry)
        here_now = presence.observe(ctx)
    data = report.build(dep.name, loaded.source, results, broken, int((time.monotonic() - started) * 1000),
                        here or None, here_now)
    if as_json:
        click.echo(report.to_json(data))
    else:
        # Piped output gets a wide table rather than rich's 80-column default.
        console = Console(file=sys.stdout) if sys.stdout.isatty() else Console(file=sys.stdout, width=160)
        report.print_table(console, data)
    return data["exit_code"]
