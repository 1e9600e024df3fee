"""Finding the executables the units run: the deployment's tools section, then flags, then PATH."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pdserve.schema.config import Deployment
from pdserve.schema.problems import ConfigError, Problem
from pdserve.schema.systemd_syntax import executable_problem


@dataclass(frozen=True)
class Toolchain:
    """Absolute paths of what the units execute; an input of rendering, never hard-coded."""

    sglang_python: str
    numactl: str
    pdserve: str
    keyed_launcher: str = field(default_factory=lambda: default_keyed_launcher())


def default_keyed_launcher() -> str:
    return str(resources.files("pdserve.launch").joinpath("keyed_launch.py"))


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
    for tool, (command, what) in _TOOLS.items():
        # Name the input a path came from: the flag, the deployment's tools section, or PATH.
        flag = f"--{tool.replace('_', '-')}"
        origin = flag if overrides.get(tool) else f"tools.{tool}"
        path = overrides.get(tool) or getattr(dep.tools, tool)
        if path is None:
            path = _which(command) or (_own_executable() if tool == "pdserve" else None)
            origin = f"tools.{tool} (found on PATH)"
        if path is None:
            problems.append(
                Problem(
                    f"tools.{tool}",
                    None,
                    f"{what} was not given and `{command}` is not on PATH",
                    f"install it, or set tools.{tool} (or pass --{tool.replace('_', '-')}) to its absolute path",
                )
            )
            if lenient:
                resolved[tool] = command
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
                resolved[tool] = command
            continue
        resolved[tool] = path
    return Toolchain(**resolved) if len(resolved) == len(_TOOLS) else None, problems
