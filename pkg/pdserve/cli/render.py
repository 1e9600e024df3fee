"""`pdserve render`: write the unit files (one host's, for a multi-host deployment), the deployment JSON they
read, and what goes with them; nothing is written if anything is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, exit_with, load_or_exit, print_problems, tool_options, tool_overrides
from pdserve.schema.problems import ConfigError, Problem, Severity, errors

if TYPE_CHECKING:
    from pdserve.schema.config import Deployment


def chosen_host(dep: Deployment, host: str | None) -> str | None:
    """The host to render or plan: required of a multi-host file, refused for a single-host one."""
    names = ", ".join(dep.hosts)
    if dep.multi_host and host is None:
        raise click.UsageError(f"deployment {dep.name} spans hosts {names}: render or plan one host at a time "
                               f"with --host NAME (e.g. --host {next(iter(dep.hosts))})")
    if not dep.multi_host and host is not None:
        raise click.UsageError(f"deployment {dep.name} declares no [hosts] (it is one host's): leave out --host")
    if host is not None and host not in dep.hosts:
        raise click.UsageError(f"--host {host}: deployment {dep.name} has no such host; its hosts: {names}")
    return host


def default_config_path(dep: Deployment, out: Path) -> str:
    return str((out / f"pdserve-{dep.name}.json").absolute())


def _python_problems(dep: Deployment, python: str, overrides: dict[str, str | None]) -> list[Problem]:
    """The units' SGLang Python, asked here: refused if it is missing, cannot run or lacks the pinned sglang
    and router. A missing NIXL only warns: render may write units for another machine (`check --host` there
    refuses it)."""
    from pdserve.check.sglang_python import package_problems
    from pdserve.render.toolchain import sglang_python_origin

    return package_problems(dep, python, sglang_python_origin(dep, overrides), nixl_severity=Severity.WARNING)


def _render(config_path: Path | None, out_dir: Path, runtime_config: str | None,
            overrides: dict[str, str | None], host: str | None = None, check_python: bool = True) -> None:
    from pdserve.render.firewall import firewall_filename, render_firewall
    from pdserve.render.toolchain import resolve_toolchain
    from pdserve.render.units import render_units
    from pdserve.schema.placement import IMPLIED_HOST

    dep = load_or_exit(config_path).deployment
    chosen = chosen_host(dep, host)
    target_config = runtime_config or default_config_path(dep, out_dir)
    try:
        tools = resolve_toolchain(dep, overrides)
        units = render_units(dep, tools, target_config, chosen or IMPLIED_HOST)
    except ConfigError as exc:
        exit_with(exc.problems)
    python = _python_problems(dep, tools.sglang_python, overrides) if check_python else []
    if errors(python):
        exit_with(python)
    print_problems(python)
    # Write everything to temporary names first, then rename: a failed render leaves nothing half written.
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {unit.filename: unit.text for unit in units}
    # A single-host file's JSON stays what it was before [hosts] existed: without the empty placement keys.
    one_host: dict[str, Any] | None = None if dep.multi_host else {"hosts": True, "router": {"hosts"}}
    files[f"pdserve-{dep.name}.json"] = dep.model_dump_json(indent=2, exclude=one_host) + "\n"
    if chosen:
        files[firewall_filename(dep)] = render_firewall(dep, chosen)
    files.update(_monitoring_files(dep))
    staged = []
    try:
        for name, text in files.items():
            final = out_dir / name
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.pdserve-tmp")
            tmp.write_text(text, encoding="utf-8")
            staged.append((tmp, final))
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        click.echo(f"error: cannot write into {out_dir}: {exc.strerror}; fix: choose a writable --out", err=True)
        raise SystemExit(Exit.PROBLEMS) from None
    for tmp, final in staged:
        tmp.replace(final)
        click.echo(str(final))


def _monitoring_files(dep: Deployment) -> dict[str, str]:
    """monitoring/<file> -> text when the deployment turns monitoring on (pdserve.render.monitoring)."""
    if not dep.monitoring.enable:
        return {}
    from pdserve.render.monitoring import SUBDIR, monitoring_files

    return {f"{SUBDIR}/{name}": text for name, text in monitoring_files(dep).items()}


@click.command("render", short_help=short_help("render"))
@config_option
@click.option("--out", "out_dir", required=True, metavar="DIR", type=click.Path(path_type=Path, file_okay=False),
              help="Directory for the unit files (e.g. /etc/systemd/system).")
@click.option("--config-path", "runtime_config", metavar="PATH",
              help="Where the units read the deployment at run time "
              "(default: the pdserve-<name>.json written into --out).")
@click.option("--host", "host", metavar="NAME", help="Multi-host deployments (required there): write this host's "
              "units, and its firewall ruleset as pdserve-<name>-firewall.nft.")
@click.option("--no-python-check", "no_python_check", is_flag=True,
              help="Do not run the SGLang Python here to ask for its packages: for units rendered for another "
                   "machine (`pdserve check --host` asks there).")
@tool_options
def render_command(config_path: Path | None, out_dir: Path, runtime_config: str | None, host: str | None,
                   no_python_check: bool, sglang_python: str | None, numactl: str | None, pdserve: str | None) -> None:
    """Write the unit files and the deployment JSON they read; nothing is written if anything is wrong.

    A multi-host deployment is rendered one host at a time (--host NAME): that host's units, the whole
    deployment's JSON (the gates read every server's address from it), and the host's nftables ruleset
    (pdserve-<name>-firewall.nft: each worker port open only to the hosts that use it; `nft -f` loads it).

    With monitoring.enable, also DIR/monitoring/: prometheus-scrape.yml (scrape_configs), prometheus.yml
    (a whole configuration around them), alerts.yml (rules) and dashboard.json (Grafana).

    Refuses without an SGLang Python (tools.sglang_python, tools.sglang_venv or --sglang-python), and one that
    does not exist, cannot run, or lacks the pinned sglang and router (with the command that installs them).
    """
    _render(config_path, out_dir, runtime_config, tool_overrides(sglang_python, numactl, pdserve), host,
            check_python=not no_python_check)
