"""`pdserve plan`: the topology, exact commands, environment and units, for people to read."""

from __future__ import annotations

import shlex

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from pdserve.render.argv import Launch, launches
from pdserve.render.toolchain import Toolchain
from pdserve.render.units import Unit
from pdserve.schema.boot import wanted_at_boot
from pdserve.schema.config import Deployment


def topology_table(dep: Deployment, runs: dict[str, Launch]) -> Table:
    table = Table(title=f"deployment {dep.name}: {dep.model.served_name or dep.model.path}", title_justify="left")
    for column in ("role", "unit", "GPUs", "NUMA", "address", "mem fraction", "TP"):
        table.add_column(column, overflow="fold")
    for role, run in runs.items():
        # boot_layout decides which units start at boot; the others are installed for `pdserve cutover`.
        unit = run.unit if wanted_at_boot(dep, role) else f"{run.unit} (not at boot)"  # type: ignore[arg-type]
        if role == "router":
            table.add_row(role, unit, "-", "-", run.url, "-", "-")
            continue
        server = dep.server(role)
        numa = str(server.numa_node) if server.numa_node is not None else "unbound"
        table.add_row(role, unit, ",".join(map(str, server.gpus)), numa, run.url,
                      f"{server.mem_fraction_static:g}", str(server.tensor_parallel))
    return table


def shell_command(argv: tuple[str, ...]) -> str:
    """The argv as a copy-pasteable shell command: the wrapper and program on the first line, then
    one program flag per line."""
    parts: list[str] = []
    in_program = False
    for arg in argv:
        quoted = shlex.quote(arg)
        if in_program and arg.startswith("--") and arg != "--":
            parts.append(" \\\n    " + quoted)
        else:
            parts.append((" " if parts else "") + quoted)
        in_program = in_program or arg == "-m" or arg.endswith(".py")
    return "".join(parts)


def launch_panel(run: Launch) -> Panel:
    env = "\n".join(f"{k}={shlex.quote(v)}" for k, v in sorted(run.env.items())) or "(none beyond the unit's)"
    body = [Text("command", style="bold"), Syntax(shell_command(run.argv), "bash", word_wrap=True),
            Text("environment", style="bold"), Text(env)]
    if run.credentials:
        body += [Text("credentials", style="bold"),
                 Text("\n".join(f"{n} <- {p} (LoadCredential=)" for n, p in run.credentials.items()))]
    return Panel(Group(*body), title=f"{run.role}: {run.unit}", title_align="left")


def print_plan(console: Console, dep: Deployment, tools: Toolchain, units: list[Unit], notes: list[str]) -> None:
    runs = launches(dep, tools)
    console.print(topology_table(dep, runs))
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    for run in runs.values():
        console.print(launch_panel(run))
    for unit in units:
        console.print(Panel(Syntax(unit.text, "ini", word_wrap=True), title=unit.filename, title_align="left"))
