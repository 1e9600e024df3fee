"""`pdserve plan`: the topology, exact commands, environment and units, in three views of one content.

- `plan_data`: the content as plain data (`plan --json`);
- `plain_text`: copyable shell for a pipe or a file, every value through pdserve.render.emit.shell: each
  role's command runs as pasted, its environment passed by env(1) and every word quoted, so the program
  gets exactly the unit's argv and Environment=; the unit files and the firewall as here-documents whose
  terminator no line of theirs equals, and everything else as `#` comments that no value can end; no box
  drawing, no line folded mid-token;
- `print_rich`: tables and panels for a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdserve.render.argv import Launch
from pdserve.render.emit import shell
from pdserve.render.toolchain import Toolchain
from pdserve.render.unit_text import Unit
from pdserve.render.units import placed_launch
from pdserve.schema.boot import wanted_at_boot
from pdserve.schema.config import Deployment
from pdserve.schema.placement import IMPLIED_HOST, Placed, place

if TYPE_CHECKING:  # rich (pygments with it) is imported by the terminal view alone: a piped plan starts faster
    from rich.console import Console, RenderableType
    from rich.panel import Panel
    from rich.table import Table

SCHEMA_VERSION = 1
# Ends each here-document (shell.heredoc adds _1, _2, ... should a line of the body equal it).
HEREDOC_END = "PDSERVE_UNIT_END"


def _process_data(dep: Deployment, p: Placed, run: Launch, one_host: bool) -> dict[str, Any]:
    """What the plan shows of one placed process. A process of a multi-host file's host also says which
    server and node it is (a single-host file's are named by their role, the key they are listed under)."""
    spec = p.spec  # None for the router
    named = {} if one_host else {"role": run.role, "server": run.server, "node_rank": run.node_rank}
    return {
        **named,
        "unit": run.unit,
        # boot_layout decides which units start at boot; the others are installed for `pdserve cutover`.
        "wanted_at_boot": wanted_at_boot(dep, p.role),
        "url": run.url,
        "gpus": list(spec.gpus) if spec else [],
        "tensor_parallel": spec.tensor_parallel if spec else None,
        "mem_fraction_static": spec.mem_fraction_static if spec else None,
        "numa": {"cpu_node": run.numa.cpu_node, "memory_node": run.numa.memory_node} if run.numa else None,
        "argv": list(run.argv),
        "env": dict(sorted(run.env.items())),
        # credential name -> host file; the process reads $CREDENTIALS_DIRECTORY/<name> (LoadCredential=).
        "credentials": dict(run.credentials),
    }


def _process_key(run: Launch, one_host: bool) -> str:
    """A single-host file's processes by role; a host's of a multi-host file by server (or "router"),
    a later node of a multi-node server with its rank."""
    if one_host or run.server is None:
        return run.role
    return run.server if run.node_rank == 0 else f"{run.server} node {run.node_rank}"


def plan_data(dep: Deployment, tools: Toolchain, units: list[Unit], notes: list[str], source: str,
              host: str = IMPLIED_HOST, firewall: str | None = None) -> dict[str, Any]:
    """Everything the plan shows of `host` (a single-host file: its one, implied host), as JSON-ready data:
    what `plan --json` prints. A multi-host file's plan names its host and carries its firewall ruleset."""
    one_host = host == IMPLIED_HOST
    runs = [(p, placed_launch(dep, p, tools)) for p in place(dep).on(host)]
    where = {} if one_host else {"host": host}
    return {
        "schema_version": SCHEMA_VERSION,
        "deployment": dep.name,
        **where,
        "source": source,
        "model": dep.model.served_name or dep.model.path,
        "roles": {_process_key(run, one_host): _process_data(dep, p, run, one_host) for p, run in runs},
        "units": {unit.filename: unit.text for unit in units},
        **({} if one_host else {"firewall": firewall}),
        "notes": list(notes),
    }


def _topology_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for role, item in data["roles"].items():
        numa = str(item["numa"]["cpu_node"]) if item["numa"] else ("-" if role == "router" else "unbound")
        rows.append([
            role, item["unit"], "yes" if item["wanted_at_boot"] else "no",
            ",".join(map(str, item["gpus"])) or "-", numa, item["url"],
            f"{item['mem_fraction_static']:g}" if item["mem_fraction_static"] is not None else "-",
            str(item["tensor_parallel"]) if item["tensor_parallel"] is not None else "-",
        ])
    return rows


_COLUMNS = ["role", "unit", "at boot", "GPUs", "NUMA", "address", "mem fraction", "TP"]


def shell_command(argv: tuple[str, ...] | list[str], env: dict[str, str] | None = None) -> str:
    """The argv, run with `env` added to the caller's environment, as a command to paste: `env` and one
    NAME=value per line, then the wrapper and program, then one program flag per line, joined by
    backslash-newline (which the shell removes)."""
    prefix = shell.environment_prefix(env or {}, argv[0]) if argv else []
    continued = " \\\n    "
    parts = [prefix[0], *(continued + word for word in prefix[1:])] if prefix else []
    in_program = False
    for n, arg in enumerate(argv):
        quoted = shell.word(arg)
        if (n == 0 and prefix) or (in_program and arg.startswith("--") and arg != "--"):
            parts.append(continued + quoted)
        else:
            parts.append((" " if parts else "") + quoted)
        in_program = in_program or arg == "-m" or arg.endswith(".py")
    return "".join(parts)


# What a pasted command leaves as it is: the unit sets these under its own state and cache directories
# (systemd's %S and %C), a person running it by hand keeps their own.
UNIT_ONLY_ENVIRONMENT = ("HOME", "XDG_CACHE_HOME")


def _command_comment(item: dict[str, Any]) -> str:
    own = " and ".join(UNIT_ONLY_ENVIRONMENT)
    if item["env"]:
        return f"command, with the unit's Environment= (but {own}, which stay yours)"
    return f"command (its unit sets no Environment= but {own}, which stay yours)"


def plain_text(data: dict[str, Any]) -> str:
    """The plan as shell a person can copy from: each role's command runs as shown, the rest is comments.
    Not meant to be piped into sh: each command runs a server in the foreground."""
    c = shell.comment
    where = f", host {data['host']}" if data.get("host") else ""
    lines = [c(f"pdserve plan of deployment {data['deployment']}{where} ({data['model']}), from {data['source']}"),
             c("Each command runs one server in the foreground: copy what you need; this is no script to run whole.")]
    rows = [_COLUMNS, *_topology_rows(data)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines += ["#", *(c("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
                     for row in rows)]
    lines += [c(f"note: {note}") for note in data["notes"]]
    for role, item in data["roles"].items():
        lines += ["", c(f"--- {role}: {item['unit']} ---")]
        for name, path in item["credentials"].items():
            lines.append(c(f"credential {name} <- {path} (LoadCredential=): the command reads "
                           f"$CREDENTIALS_DIRECTORY/{name}; by hand, export CREDENTIALS_DIRECTORY as a directory "
                           f"only you can read, holding a copy of {path} named {name}"))
        lines += [c(_command_comment(item)), shell_command(item["argv"], item["env"])]
    for filename, text in data["units"].items():
        lines += ["", c(f"--- unit file {filename} ---"),
                  *shell.heredoc(f"cat > {shell.word(filename)}", text, HEREDOC_END)]
    if data.get("firewall"):
        name = f"pdserve-{data['deployment']}-firewall.nft"
        lines += ["", c(f"--- firewall {name} (nftables: load with nft -f) ---"),
                  *shell.heredoc(f"cat > {shell.word(name)}", data["firewall"], HEREDOC_END)]
    return "\n".join(lines) + "\n"


def topology_table(data: dict[str, Any]) -> Table:
    from rich.table import Table

    where = f" on host {data['host']}" if data.get("host") else ""
    table = Table(title=f"deployment {data['deployment']}{where}: {data['model']}", title_justify="left")
    for column in _COLUMNS:
        table.add_column(column, overflow="fold")
    for row in _topology_rows(data):
        table.add_row(*row)
    return table


def launch_panel(role: str, item: dict[str, Any]) -> Panel:
    from rich.console import Group
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    body: list[RenderableType] = [Text(_command_comment(item), style="bold"),
            Syntax(shell_command(item["argv"], item["env"]), "bash", word_wrap=True)]
    if item["credentials"]:
        body += [Text("credentials", style="bold"),
                 Text("\n".join(f"{n} <- {p} (LoadCredential=)" for n, p in item["credentials"].items()))]
    return Panel(Group(*body), title=f"{role}: {item['unit']}", title_align="left")


def print_rich(console: Console, data: dict[str, Any]) -> None:
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    console.print(topology_table(data))
    for note in data["notes"]:
        console.print(Text.assemble(("note: ", "yellow"), note))
    for role, item in data["roles"].items():
        console.print(launch_panel(role, item))
    for filename, text in data["units"].items():
        console.print(Panel(Syntax(text, "ini", word_wrap=True), title=filename, title_align="left"))
    if data.get("firewall"):
        console.print(Panel(Text(data["firewall"]), title="firewall (nftables)", title_align="left"))
