"""`pdserve bench`: load through the public endpoint with SGLang's own client; with --compare, each layout
in turn by the cutover, and back to the layout that served at the start.

Everything that can be refused is refused before the first request: the workload (its fields, its lengths
against the context length), the model directory's tokenizer, the client's Python, the key, the plot's
library, the layouts named. Exit codes (pdserve.cli.exits): 0 every point measured; 1 refused, a point
without figures, a layout whose cutover failed, or interrupted; 2 usage; 3 the start layout could not be
restored.
"""

from __future__ import annotations

import os
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pdserve.cli.commands import short_help
from pdserve.cli.exits import Exit
from pdserve.cli.options import config_option, exit_with, load_or_exit, seconds_option, tool_overrides
from pdserve.schema import strict_json
from pdserve.schema.problems import Problem

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdserve.bench.sweep import Sweep
    from pdserve.bench.workload import Workload
    from pdserve.cutover.machine import Cutover
    from pdserve.schema.boot import Layout
    from pdserve.schema.config import Deployment

SCHEMA_VERSION = 1
MAX_WORKLOADS_BYTES = 1024 * 1024


def _say(text: str) -> None:
    click.echo(text, err=True)  # progress on stderr: stdout is the report (or --json)


def _workloads_file(path: Path | None) -> tuple[dict[str, Any] | None, list[Problem]]:
    if path is None:
        return None, []
    try:
        with path.open("rb") as file:
            data = file.read(MAX_WORKLOADS_BYTES + 1)
    except OSError as exc:
        return None, [Problem("--workloads", str(path), f"cannot be read: {exc.strerror}", "name a readable file")]
    if len(data) > MAX_WORKLOADS_BYTES:
        return None, [Problem("--workloads", str(path), f"is larger than {MAX_WORKLOADS_BYTES} bytes",
                              "name a workloads file ([workloads.NAME] tables)")]
    try:
        return tomllib.loads(data.decode("utf-8")), []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return None, [Problem("--workloads", str(path), f"is not TOML: {exc}", "fix the file's syntax")]


def _model_files(path: str) -> list[str] | None:
    try:
        return os.listdir(path)
    except OSError:
        return None


def _cutovers(dep: Deployment, systemctl_command: str) -> Callable[[Layout, bool], Cutover]:
    """The cutover to a layout on this host, as `pdserve cutover` makes it (the same systemctl command)."""
    import shlex

    from pdserve.cli.cutover import acts_locally, probers
    from pdserve.cutover.host import HostEdge
    from pdserve.cutover.machine import Cutover
    from pdserve.cutover.plan import plan_for
    from pdserve.probes.systemctl import Systemctl

    command = shlex.split(systemctl_command)

    def machine(layout: Layout, probe_port: bool) -> Cutover:
        plan = plan_for(dep, layout)
        edge = HostEdge(dep, plan, Systemctl(command), acts_locally(command))
        return Cutover(plan, edge, probers(plan) if probe_port else [])

    return machine


def _accepted(dep: Deployment, workload_name: str, workloads_path: Path | None, compare_text: str | None,
              sglang_python: str | None) -> tuple[Any, str, tuple[Layout, ...], str | None, list[Problem]]:
    """(workload, client's Python, layouts to compare, API key, every problem): all that is refused before
    the first request."""
    from pdserve.bench import layouts, workload
    from pdserve.cutover.host import read_api_key
    from pdserve.render.toolchain import missing_tools, preview_toolchain

    file_tables, problems = _workloads_file(workloads_path)
    tables, more = workload.workloads(file_tables)
    problems += more
    chosen, more = workload.pick(tables, workload_name)
    problems += more
    if chosen is not None:
        problems += workload.fit_problems(chosen, dep.model.context_length, dep.model.path,
                                          _model_files(dep.model.path))
    overrides = tool_overrides(sglang_python, None, None)
    problems += missing_tools(dep, overrides, "sglang_python")
    python = preview_toolchain(dep, overrides)[0].sglang_python
    compared: tuple[Layout, ...] = ()
    if compare_text is not None:
        compared, why = layouts.parse_layouts(compare_text)
        if why:
            problems.append(Problem("--compare", compare_text, why, "write --compare single,pd"))
        elif dep.multi_host:
            problems.append(Problem("--compare", compare_text, "a multi-host deployment has no single-server "
                                    "layout to compare with", "leave --compare out"))
    key, key_problem = read_api_key(dep)
    if key_problem:
        problems.append(Problem("router.api_key_file", dep.router.api_key_file, key_problem,
                                "run bench as a user who can read the key (root, or its owner)"))
    return chosen, python, compared, key, problems


def _writable(option: str, path: Path | None) -> list[Problem]:
    """A file the run will write at its end: refused now if its directory is not there to write into, so a
    run's figures are never lost to a typo in a path."""
    if path is None:
        return []
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        return [Problem(option, str(path), f"its directory {directory} does not exist", "create it, or name a "
                        "file in an existing directory")]
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return [Problem(option, str(path), "cannot be written by this user", "name a file this user can write")]
    return []


def _history(path: Path | None, deployment: str, chosen: Workload, at: str,
             sweeps: list[Sweep]) -> tuple[Any, list[str]]:
    """The last run of the same workload in the history, and this run appended; what went wrong as notes
    (never an exception: the figures are measured by now and must reach the report)."""
    from pdserve.bench import history

    if path is None or not sweeps:
        return None, []
    read = history.read(path)
    if read.problem:
        return None, [f"{read.problem}; this run was not appended"]
    notes = [f"{read.skipped} unreadable line(s) of {path} skipped"] if read.skipped else []
    try:
        history.append(path, history.entry(deployment, at, chosen, sweeps))
    except OSError as exc:
        notes.append(f"could not append to {path}: {exc.strerror}")
    return history.last(read.entries, deployment, chosen), notes


def _plot(path: Path | None, title: str, sweeps: list[Sweep]) -> list[str]:
    from pdserve.bench import plot

    if path is None or not any(r.measured for s in sweeps for r in s.results):
        return [] if path is None else [f"no plot: no point was measured ({path} not written)"]
    try:
        plot.draw(sweeps, title, path)
    except (OSError, ValueError, RuntimeError) as exc:  # matplotlib's own errors are these
        return [f"could not write the plot {path}: {exc}"]
    return []


@click.command("bench", short_help=short_help("bench"))
@config_option
@click.option("--workload", "workload_name", metavar="NAME", default="chat", show_default=True,
              help="The workload: chat, long-prefill, saturate, smoke, or one of a --workloads file.")
@click.option("--workloads", "workloads_path", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML file of [workloads.NAME] tables (docs/bench.md lists the fields); adds to the built-ins.")
@click.option("--compare", "compare_text", metavar="LAYOUTS", default=None,
              help="Run the workload on each layout (single,pd), switching with the cutover and back.")
@click.option("--history", "history_path", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False),
              help="Append the results to this file (JSON Lines) and show the change against its last run of "
                   "the same workload.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@click.option("--plot", "plot_path", metavar="PNG", type=click.Path(path_type=Path, dir_okay=False),
              help="Write latency against throughput across the sweep as a PNG (needs matplotlib).")
@click.option("--sglang-python", metavar="PYTHON", default=None,
              help="Python that runs the client, sglang.bench_serving (default: the deployment's SGLang Python).")
@seconds_option("--point-timeout", 3600.0, 10, "Most seconds one sweep point may run; the client is ended "
                "after it and the point has no figures.")
@click.option("--systemctl", "systemctl_command", metavar="COMMAND", default="systemctl", show_default=True,
              help="--compare: the systemctl command the cutover drives.")
def bench(config_path: Path | None, workload_name: str, workloads_path: Path | None, compare_text: str | None,
          history_path: Path | None, as_json: bool, plot_path: Path | None, sglang_python: str | None,
          point_timeout: float, systemctl_command: str) -> None:
    """Measure how well the deployment serves: TTFT, ITL, latency, throughput, goodput, KV hand-off.

    The load goes through the public endpoint (with the router's key) from SGLang's own benchmark client,
    with random prompts drawn from the model directory's tokenizer. --compare single,pd measures both
    layouts with the same requests and names the better one on each figure.
    """
    from pdserve.bench.workload import Workload

    dep = load_or_exit(config_path).deployment
    chosen, python, compared, key, problems = _accepted(dep, workload_name, workloads_path, compare_text,
                                                        sglang_python)
    problems += _writable("--history", history_path) + _writable("--plot", plot_path)
    if plot_path is not None:
        from pdserve.bench import plot

        if why := plot.missing():
            problems.append(Problem("--plot", str(plot_path), why, "install matplotlib, or leave --plot out"))
    if problems or not isinstance(chosen, Workload):
        exit_with(problems)
    from pdserve.bench.runs import Runner
    from pdserve.cli.cutover import termination_interrupts

    runner = Runner(dep, chosen, python, key, point_timeout, _say)
    # SIGTERM/SIGHUP end a run as Ctrl-C does: what was measured is kept, and a cutover in flight rolls back.
    with termination_interrupts():
        outcome = (runner.compare(compared, _cutovers(dep, systemctl_command)) if compared
                   else runner.serving())
    at = datetime.now(UTC).isoformat(timespec="seconds")
    last, notes = _history(history_path, dep.name, chosen, at, outcome.sweeps)
    notes += _plot(plot_path, f"{dep.name}: {chosen.name} ({at})", outcome.sweeps)
    outcome.notes += notes
    report = outcome.report(at, last, history_path, plot_path)
    if as_json:
        click.echo(strict_json.dumps({"schema_version": SCHEMA_VERSION, **report.data}, indent=2))
    else:
        click.echo("\n".join(report.lines))
    sys.exit(Exit.OK if outcome.complete else Exit.PROBLEMS if outcome.restored else Exit.INTERNAL)
