"""Check rendered command lines with the real parsers of the pinned SGLang and router (smg).

The parsers run in the SGLang Python (a separate environment from pdserve's own), in one subprocess
with a deadline. A flag the pinned version does not know becomes a problem that names the flag and the
field it came from. Parsers that cannot be imported are a stated skip off the target host (a laptop
need not have SGLang's dependencies), and an error when the host checks run: there the SGLang Python is what
the units will run. Whether it holds the pinned packages is pdserve.check.sglang_python's question.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from importlib import resources

from pdserve.check.sglang_python import VERSION_TIMEOUT_SEC, cannot_run, needs_nixl
from pdserve.render.argv import ROUTER_MODULE, SERVER_MODULE, node_args, router_args, server_args
from pdserve.schema import pins
from pdserve.schema.config import Deployment
from pdserve.schema.problems import Problem
from pdserve.schema.topology import Node, servers

PARSE_TIMEOUT_SEC = 180.0

_FLAG = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9-]*)")


@dataclass(frozen=True)
class ParserReport:
    problems: list[Problem]
    checked: list[str]   # roles whose argv the real parser accepted or rejected
    skipped: list[str]   # reasons a role could not be checked


def requests_for(dep: Deployment) -> list[dict]:
    """One parse per role; `extra` says how many trailing args come from the role's extra_args, so the
    parser check can tell a bad extra arg from a rendering bug."""
    # "role" names the server as its fields are written: prefill, decode (one host), prefill[0], ... (several).
    # A multi-node server's nodes differ only in --node-rank and --host: node 0 stands for them.
    items = [{"role": server.field, "program": "server", "args": node_args(dep, Node(server, 0)),
              "extra": len(server.spec.extra_args)} for server in servers(dep)]
    if dep.fallback is not None:
        items.append({"role": "fallback", "program": "server", "args": server_args(dep, "fallback"),
                      "extra": len(dep.fallback.extra_args)})
    items.append({"role": "router", "program": "router", "args": router_args(dep),
                  "extra": len(_extra_args(dep, "router"))})
    return items


def _extra_args(dep: Deployment, role: str) -> list[str]:
    """The extra_args of the router, the fallback, or the server written at `role` (prefill, prefill[0], ...)."""
    if role == "router":
        return dep.router.extra_args
    if role == "fallback" and dep.fallback is not None:  # the parser check lists it only where the file has one
        return dep.fallback.extra_args
    return next(server.spec.extra_args for server in servers(dep) if server.field == role)


def problem_for(dep: Deployment, role: str, detail: str, culprit: str | None = None, arg: str | None = None) -> Problem:
    """Turn a parser's error into a problem that points at the field the bad flag came from: the extra
    arg the parser check found guilty (`culprit`/`arg`), else a flag of extra_args the message names."""
    extra = _extra_args(dep, role)
    extra_flags = {arg.split("=", 1)[0] for arg in extra}
    flags = [f for f in _FLAG.findall(detail) if f in extra_flags]
    program = (f"{pins.ROUTER_DISTRIBUTION} {pins.ROUTER_VERSION}" if role == "router"
               else f"sglang {pins.SGLANG_VERSION}")
    module = ROUTER_MODULE if role == "router" else SERVER_MODULE
    if culprit == "extra":
        shown = arg if arg is not None else extra
        what = f"remove or correct {arg}" if arg is not None else "remove or correct the extra arguments"
        return Problem(
            f"{role}.extra_args",
            shown,
            f"rejected by the {program} parser: {detail}",
            f"{what} (see `python -m {module} --help`)",
        )
    if flags:
        return Problem(
            f"{role}.extra_args",
            flags[0],
            f"rejected by the {program} parser: {detail}",
            f"remove {flags[0]} or replace it with the flag {program} uses (see its --help)",
        )
    return Problem(
        f"{role} (rendered command)",
        None,
        f"rejected by the {program} parser: {detail}",
        "this is a pdserve rendering bug or a version mismatch; check `pdserve plan` and the pinned versions",
    )


# The entry point pdserve's SGLang plugin is found by (kernels/python/pyproject.toml): SGLang loads the
# sglang.srt.plugins entry points of the distributions on its sys.path in every scheduler process.
KERNEL_PLUGIN = ("pdserve_kernels", "pdserve_kernels.sglang_plugin:load")
_PLUGINS = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps(sorted([e.name, e.value] for e in m.entry_points(group='sglang.srt.plugins'))))\n"
)


def kernel_plugin_problems(dep: Deployment, sglang_python: str, origin: str,
                           timeout: float = VERSION_TIMEOUT_SEC) -> tuple[list[Problem], bool]:
    """(errors, asked): when a server sets attention_kernels = "pdserve", `sglang_python` must hold the
    plugin's distribution (its sglang.srt.plugins entry point), or SGLang would run its own kernels with
    nothing but a missing log line to show for it. Asks only when some server asks for the kernels."""
    written = [(server.field, server.spec) for server in servers(dep)]
    written += [("fallback", dep.fallback)] if dep.fallback is not None else []
    fields = [f"{field}.attention_kernels" for field, spec in written if spec.attention_kernels == "pdserve"]
    if not fields:
        return [], False
    name, value = KERNEL_PLUGIN
    fix = (f"use an SGLang environment with the pdserve-kernels distribution (the flake's sglang-env has it), or "
           f"build and install it into this one: `bash kernels/build.sh && bash kernels/python/build_wheel.sh && "
           f"uv pip install --python {sglang_python} dist/pdserve_kernels-*.whl`; or set {fields[0]} = \"sglang\"")
    try:
        done = subprocess.run([sglang_python, "-c", _PLUGINS], capture_output=True, text=True, timeout=timeout,
                              check=False)
        found = [tuple(pair) for pair in json.loads(done.stdout.strip().splitlines()[-1])]
    except OSError as exc:
        return [cannot_run(origin, sglang_python, f"cannot be run here: {exc.strerror or exc}", needs_nixl(dep))], True
    except subprocess.TimeoutExpired:
        return [cannot_run(origin, sglang_python, f"did not list its SGLang plugins within {timeout:.0f} s",
                            needs_nixl(dep))], True
    except (IndexError, TypeError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [cannot_run(origin, sglang_python, f"failed when asked its SGLang plugins: {tail}",
                           needs_nixl(dep))], True
    if (name, value) in found:
        return [], True
    has = ", ".join(f"{n} = {v}" for n, v in found) or "none"
    return [Problem(fields[0], "pdserve",
                    f"asks for pdserve's kernels, but {origin} ({sglang_python}) has no sglang.srt.plugins entry "
                    f"point {name} = {value} (it has: {has}): SGLang would run its own kernels", fix)], True


def check_with_parsers(dep: Deployment, sglang_python: str, timeout: float = PARSE_TIMEOUT_SEC,
                       required_by: str | None = None) -> ParserReport:
    """The parsers' verdict on every role's argv. With `required_by` (where the SGLang Python came from,
    e.g. tools.sglang_python), a parser that cannot run is an error naming it, not a skip."""
    script = str(resources.files("pdserve.launch").joinpath("parse_check.py"))
    items = requests_for(dep)

    def cannot(why: str) -> ParserReport:
        if required_by:
            return ParserReport([cannot_run(required_by, sglang_python, f"cannot run the parsers ({why})",
                                           needs_nixl(dep))], [], [])
        return ParserReport([], [], [f"parser check skipped: {sglang_python} {why}"])

    try:
        done = subprocess.run(
            [sglang_python, script],
            input=json.dumps(items),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return cannot("does not exist")
    except subprocess.TimeoutExpired:
        return cannot(f"did not answer within {timeout:.0f} s")
    try:
        results = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return cannot(f"failed: {tail}")
    problems, checked = [], []
    unavailable: dict[str, list[str]] = {}  # reason -> roles, so one missing package is one line
    for result in results:
        role = result["role"]
        if result["status"] == "unavailable":
            unavailable.setdefault(result["detail"], []).append(role)
            continue
        checked.append(role)
        if result["status"] == "error":
            problems.append(problem_for(dep, role, result["detail"], result.get("culprit"), result.get("arg")))
    if required_by:
        problems += [cannot_run(required_by, sglang_python,
                                f"cannot import the parser of {', '.join(roles)}: {reason}", needs_nixl(dep))
                     for reason, roles in unavailable.items()]
        return ParserReport(problems, checked, [])
    skipped = [f"{', '.join(roles)}: parser not importable in {sglang_python} ({reason})"
               for reason, roles in unavailable.items()]
    return ParserReport(problems, checked, skipped)
