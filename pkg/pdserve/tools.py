"""Finding the executables the units run: the deployment's tools section, then flags, then PATH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pdserve.commands import Toolchain
from pdserve.config import Deployment
from pdserve.problems import ConfigError, Problem
from pdserve.systemd_syntax import executable_problem

# tool field -> (command looked up on PATH, what it is)
_TOOLS = {
    "sglang_python": ("python3", "the Python that has sglang and sglang-router installed"),
    "numactl": ("numactl", "numactl (CPU/memory NUMA binding)"),
    "pdserve": ("pdserve", "the pdserve executable (readiness gates)"),
}


def _which(command: str) -> str | None:
    found = shutil.which(command)
    return str(Path(found).absolute()) if found else None


def _own_executable() -> str | None:
    candidate = Path(sys.argv[0])
    return str(candidate.absolute()) if candidate.name == "pdserve" and candidate.exists() else None


def resolve_toolchain(dep: Deployment, overrides: dict[str, str | None] | None = None) -> Toolchain:
    """Flags beat the deployment's tools section, which beats PATH. Missing tools are one error each."""
    toolchain, problems = _resolve(dep, overrides or {})
    if problems:
        raise ConfigError(problems, "tools")
    return toolchain


def toolchain_problems(dep: Deployment, overrides: dict[str, str | None] | None = None) -> list[Problem]:
    """The tool paths that could never go into a unit (control characters, quotes, relative, ...): errors
    for `pdserve check` even where a missing tool is only a note."""
    _, problems = _resolve(dep, overrides or {}, lenient=True)
    return [p for p in problems if p.value is not None]


def preview_toolchain(dep: Deployment, overrides: dict[str, str | None] | None = None) -> tuple[Toolchain, list[str]]:
    """For showing a plan on a machine that lacks the tools: missing ones appear as their bare
    command name, and each such substitution is returned as a note to print."""
    toolchain, problems = _resolve(dep, overrides or {}, lenient=True)
    notes = [f"{p.field}: {p.message}; shown as its bare command name" for p in problems]
    return toolchain, notes


def _resolve(dep: Deployment, overrides: dict[str, str | None], lenient: bool = False) -> tuple[Toolchain, list[Problem]]:
    resolved: dict[str, str] = {}
    problems = []
    for field, (command, what) in _TOOLS.items():
        # Name the input a path came from: the flag, the deployment's tools section, or PATH.
        flag = f"--{field.replace('_', '-')}"
        origin = flag if overrides.get(field) else f"tools.{field}"
        path = overrides.get(field) or getattr(dep.tools, field)
        if path is None:
            path = _which(command) or (_own_executable() if field == "pdserve" else None)
            origin = f"tools.{field} (found on PATH)"
        if path is None:
            problems.append(
                Problem(
                    f"tools.{field}",
                    None,
                    f"{what} was not given and `{command}` is not on PATH",
                    f"install it, or set tools.{field} (or pass --{field.replace('_', '-')}) to its absolute path",
                )
            )
            if lenient:
                resolved[field] = command
            continue
        # Flags and PATH are input too: the same rules as tools.* in the deployment (systemd executes it).
        problem = executable_problem(path)
        if problem:
            problems.append(Problem(
                origin, path, problem,
                "give the absolute path of the executable, without quotes, backslashes, control characters "
                "or a trailing /",
            ))
            if lenient:
                resolved[field] = command
            continue
        resolved[field] = path
    return Toolchain(**resolved) if len(resolved) == len(_TOOLS) else None, problems
