"""Limits of systemd and Linux that a whole rendered command line must fit, checked when a file is read.

A rule of the render layer (it measures rendered argv), handed to the loader in RENDER_RULES so its
problems are reported with every schema problem in one pass.

Each value is bounded on its own (systemd_syntax.text_problem); this rule bounds their sum per role:
the ExecStart= line must stay under systemd's LONG_LINE_MAX (a longer line makes the unit fail to
load), and argv plus environment under the kernel's execve budget (E2BIG otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator

from pdserve.render.argv import node_args, router_args, server_args, sglang_environment
from pdserve.schema.config import Deployment
from pdserve.schema.problems import Problem
from pdserve.schema.systemd_syntax import LONG_LINE_MAX, PATH_MAX
from pdserve.schema.topology import Node, servers

# Room for what the rule does not know yet: the tool paths (numactl, python, keyed launcher), each at
# most PATH_MAX and at most doubled by escaping, and their fixed flags.
_TOOLS_MARGIN = 4 * 2 * PATH_MAX + 256
# Linux grants argv + environment a quarter of the stack limit: 2 MiB with the usual 8 MiB. systemd
# adds its own variables (PATH, INVOCATION_ID, CREDENTIALS_DIRECTORY, ...), hence the margin.
EXEC_BUDGET = 2 * 1024 * 1024 - 64 * 1024


def _commands(dep: Deployment) -> Iterator[tuple[str, str, list[str], dict[str, str]]]:
    """(where it is written, what it is, argv, environment) of every process the deployment runs: a
    multi-node server's nodes differ only in --node-rank and --host, so its node 0 stands for them."""
    for server in servers(dep):
        yield server.field, server.role, node_args(dep, Node(server, 0)), sglang_environment(dep, server.spec)
    yield "router", "router", router_args(dep), dict(dep.router.env)
    if dep.fallback is not None:
        yield "fallback", "fallback", server_args(dep, "fallback"), sglang_environment(dep, dep.fallback)


def _quoted_size(arg: str) -> int:
    """Bytes of `arg` as systemd_syntax.exec_word writes it at most: quotes, and `\\ " % $` doubled."""
    return len(arg.encode("utf-8", "surrogatepass")) + sum(arg.count(c) for c in '\\"%$') + 2


def command_lines_fit(dep: Deployment) -> Iterator[Problem]:
    for field, role, args, env in _commands(dep):
        line = sum(_quoted_size(a) + 1 for a in args) + _TOOLS_MARGIN
        if line >= LONG_LINE_MAX:
            yield Problem(
                f"{field}.extra_args", f"({len(args)} arguments)",
                f"makes the ExecStart= line about {line} bytes; systemd refuses lines of {LONG_LINE_MAX} bytes "
                "or more (LONG_LINE_MAX) and the unit would not load",
                "pass fewer or shorter extra arguments",
            )
            continue
        env_bytes = sum(len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 for k, v in env.items())
        arg_bytes = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in args) + 3 * PATH_MAX
        if env_bytes + arg_bytes > EXEC_BUDGET:
            where = "environment" if role != "router" and env_bytes > arg_bytes else (
                "router.env" if role == "router" and env_bytes > arg_bytes else f"{field}.extra_args")
            yield Problem(
                where, f"({env_bytes} bytes of environment, {arg_bytes} of arguments)",
                f"the {role} process's argv and environment exceed {EXEC_BUDGET} bytes; execve would fail (E2BIG)",
                "shorten the environment values or the extra arguments",
            )


RENDER_RULES = (command_lines_fit,)
