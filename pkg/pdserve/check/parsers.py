"""Check rendered command lines with the real parsers of the pinned SGLang and sglang-router.

The parsers run in the SGLang Python (a separate environment from pdserve's own), in one subprocess
with a deadline. A flag the pinned version does not know becomes a problem that names the flag and the
field it came from; parsers that cannot be imported become a stated skip, not a pass.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from importlib import resources

from pdserve.render.argv import router_args, server_args
from pdserve.schema.config import Deployment, Role
from pdserve.schema.problems import Problem

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
    items = [{"role": role, "program": "server", "args": server_args(dep, role), "extra": len(_extra_args(dep, role))}
             for role in ("prefill", "decode", "fallback")]
    items.append({"role": "router", "program": "router", "args": router_args(dep),
                  "extra": len(_extra_args(dep, "router"))})
    return items


def _extra_args(dep: Deployment, role: Role) -> list[str]:
    if role == "router":
        return dep.router.extra_args
    return dep.server(role).extra_args


def problem_for(dep: Deployment, role: Role, detail: str, culprit: str | None = None, arg: str | None = None) -> Problem:
    """Turn a parser's error into a problem that points at the field the bad flag came from: the extra
    arg the parser check found guilty (`culprit`/`arg`), else a flag of extra_args the message names."""
    extra = _extra_args(dep, role)
    extra_flags = {arg.split("=", 1)[0] for arg in extra}
    flags = [f for f in _FLAG.findall(detail) if f in extra_flags]
    program = "sglang-router 0.3.2" if role == "router" else "sglang 0.5.23"
    if culprit == "extra":
        shown = arg if arg is not None else extra
        what = f"remove or correct {arg}" if arg is not None else "remove or correct the extra arguments"
        return Problem(
            f"{role}.extra_args",
            shown,
            f"rejected by the {program} parser: {detail}",
            f"{what} (see `python -m {'sglang_router.launch_router' if role == 'router' else 'sglang.launch_server'} --help`)",
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


def check_with_parsers(dep: Deployment, sglang_python: str, timeout: float = PARSE_TIMEOUT_SEC) -> ParserReport:
    script = str(resources.files("pdserve.launch").joinpath("parse_check.py"))
    items = requests_for(dep)
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
        return ParserReport([], [], [f"parser check skipped: {sglang_python} does not exist"])
    except subprocess.TimeoutExpired:
        return ParserReport([], [], [f"parser check skipped: {sglang_python} did not answer within {timeout:.0f} s"])
    try:
        results = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return ParserReport([], [], [f"parser check skipped: {sglang_python} failed: {tail}"])
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
    skipped = [f"{', '.join(roles)}: parser not importable in {sglang_python} ({reason})"
               for reason, roles in unavailable.items()]
    return ParserReport(problems, checked, skipped)
