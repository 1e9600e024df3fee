"""Finding the executables the units run: flags, then the deployment's tools section, then PATH (never
for the SGLang Python, which is given or found in the virtual environment the file names)."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

from pdserve.render.emit import shell
from pdserve.render.reach import unreachable
from pdserve.schema import pins
from pdserve.schema.config import ROLES, SERVER_ROLES, Deployment
from pdserve.schema.problems import ConfigError, Problem
from pdserve.schema.systemd_syntax import executable_problem
from pdserve.schema.tools import SEARCH_PATH_FIX, search_path_problem, venv_python


@dataclass(frozen=True)
class Toolchain:
    """Absolute paths of what the units execute; an input of rendering, never hard-coded."""

    sglang_python: str
    numactl: str
    pdserve: str
    keyed_launcher: str = field(default_factory=lambda: default_keyed_launcher())


def default_keyed_launcher() -> str:
    return str(resources.files("pdserve.launch").joinpath("keyed_launch.py"))


# tool field -> (command looked up on PATH, or None where PATH is never asked; what it is)
_TOOLS: dict[str, tuple[str | None, str]] = {
    # Never `python3` from PATH: that is rarely the Python with the pinned sglang, and the units would
    # only fail at launch. Given (tools.sglang_python, --sglang-python) or found (tools.sglang_venv).
    "sglang_python": (None, "the Python that has sglang and the router (smg) installed"),
    "numactl": ("numactl", "numactl (CPU/memory NUMA binding)"),
    "pdserve": ("pdserve", "the pdserve executable (readiness gates)"),
}
_EXECUTABLE_FIX = ("give the absolute path of the executable, without quotes, backslashes, control characters or a "
                   "trailing /")
# What `pdserve plan` shows in place of an SGLang Python nobody named.
SGLANG_PYTHON_PLACEHOLDER = "sglang-python"


def _which(command: str) -> str | None:
    found = shutil.which(command)
    return str(Path(found).absolute()) if found else None


def _own_executable() -> str | None:
    candidate = Path(sys.argv[0])
    return str(candidate.absolute()) if candidate.name == "pdserve" and candidate.exists() else None


def resolve_toolchain(dep: Deployment, overrides: dict[str, str | None] | None = None) -> Toolchain:
    """Flags beat the deployment's tools section, which beats PATH. Missing tools are one error each."""
    toolchain, found = _resolve(dep, overrides or {})
    if found or toolchain is None:  # None only where some tool has a problem
        raise ConfigError([problem for _, problem in found], "tools")
    return toolchain


def toolchain_problems(dep: Deployment, overrides: dict[str, str | None] | None = None) -> list[Problem]:
    """The tool paths that could never go into a unit (control characters, quotes, relative, ...): errors
    for `pdserve check` even where a missing tool is only a note."""
    _, found = _resolve(dep, overrides or {}, lenient=True)
    return [problem for _, problem in found if problem.value is not None]


def missing_tools(dep: Deployment, overrides: dict[str, str | None] | None = None, *only: str) -> list[Problem]:
    """The tools nobody named and PATH does not have (all of them, or `only` those), as errors."""
    _, found = _resolve(dep, overrides or {}, lenient=True)
    return [problem for tool, problem in found if problem.value is None and (not only or tool in only)]


def preview_toolchain(dep: Deployment, overrides: dict[str, str | None] | None = None) -> tuple[Toolchain, list[str]]:
    """For showing a plan on a machine that lacks the tools: missing ones appear as a bare name (the
    command, or `sglang-python`), and each such substitution is returned as a note to print."""
    toolchain, found = _resolve(dep, overrides or {}, lenient=True)
    if toolchain is None:
        raise AssertionError("lenient resolution puts a placeholder in for every missing tool")
    notes = [f"{p.field}: {p.message}; shown as `{getattr(toolchain, tool)}`; to render, {p.fix}" for tool, p in found]
    return toolchain, notes


def sglang_python_origin(dep: Deployment, overrides: dict[str, str | None] | None = None) -> str:
    """Where the SGLang Python came from, as a user would change it: the flag or the file's field."""
    if (overrides or {}).get("sglang_python"):
        return "--sglang-python"
    return "tools.sglang_venv" if dep.tools.sglang_venv else "tools.sglang_python"


def _given(dep: Deployment, tool: str, overrides: dict[str, str | None]) -> tuple[str | None, str]:
    """(path, origin) of a tool from the flags, then the deployment's tools section."""
    if overrides.get(tool):
        return overrides[tool], f"--{tool.replace('_', '-')}"
    if tool == "sglang_python" and dep.tools.sglang_venv:
        return venv_python(dep.tools.sglang_venv), "tools.sglang_venv"
    return getattr(dep.tools, tool), f"tools.{tool}"


# Where the fixes suggest making the SGLang Python's environment when no path names one.
DEFAULT_VENV = "/opt/sglang-env"
# A python under these is the system's: an environment is never made over it.
_SYSTEM_PREFIXES = {"/", "/usr", "/usr/local"}


def install_command(python: str, nixl: bool = True) -> str:
    """The shell command that installs the pins (pdserve.schema.pins) into the environment of `python`."""
    return " ".join([shell.word(python), "-m", "pip", "install", *map(shell.word, pins.serving_requirements(nixl))])


def venv_for(python: str) -> str:
    """The virtual environment to make for `python`: the one it would be bin/python of, or DEFAULT_VENV."""
    path = PurePosixPath(python)
    venv = str(path.parent.parent)
    if path.parent.name != "bin" or not path.is_absolute() or venv in _SYSTEM_PREFIXES:
        return DEFAULT_VENV
    return venv


def create_command(python: str, nixl: bool = True) -> str:
    """The shell command that makes the virtual environment venv_for(`python`) and installs the pins into
    it: the install path without Nix."""
    venv = venv_for(python)
    return f"python3 -m venv {shell.word(venv)} && {install_command(f'{venv}/bin/python', nixl)}"


def _missing(tool: str, command: str | None, what: str, nixl: bool) -> Problem:
    flag = f"--{tool.replace('_', '-')}"
    if command is None:
        return Problem(f"tools.{tool}", None, f"{what} was not given (pdserve does not guess it from PATH)",
                       f"set tools.{tool} to its absolute path, or tools.sglang_venv to its virtual environment, "
                       f"or pass {flag}; without Nix, make one first: "
                       f"`{create_command(DEFAULT_VENV + '/bin/python', nixl)}`")
    return Problem(f"tools.{tool}", None, f"{what} was not given and `{command}` is not on PATH",
                   f"install it, or set tools.{tool} (or pass {flag}) to its absolute path")


def _resolve(dep: Deployment, overrides: dict[str, str | None],
             lenient: bool = False) -> tuple[Toolchain | None, list[tuple[str, Problem]]]:
    """The toolchain (None unless every tool resolved, or `lenient` put placeholders in), and each
    tool's problem."""
    resolved: dict[str, str] = {}
    problems = []
    for tool, (command, what) in _TOOLS.items():
        # Name the input a path came from: the flag, the deployment's tools section, or PATH.
        path, origin = _given(dep, tool, overrides)
        if path is None and command is not None:
            path = _which(command) or (_own_executable() if tool == "pdserve" else None)
            origin = f"tools.{tool} (found on PATH)"
        placeholder = command or SGLANG_PYTHON_PLACEHOLDER
        if path is None:
            problems.append((tool, _missing(tool, command, what, dep.transfer.backend == "nixl")))
            if lenient:
                resolved[tool] = placeholder
            continue
        # Flags and PATH are input too: the same rules as tools.* in the deployment (systemd executes it).
        problem = executable_problem(path)
        found = (problem, _EXECUTABLE_FIX) if problem else None
        searched = search_path_problem(path) if found is None and tool == "sglang_python" else None
        if searched:
            found = (searched, SEARCH_PATH_FIX)
        if found is None and (origin.startswith("--") or "PATH" in origin):
            # A path from the file is judged with the file (pdserve.render.reach's rule); these only here.
            found = unreachable(path, SERVER_ROLES if tool == "numactl" else ROLES, "execute")
        if found:
            problems.append((tool, Problem(origin, path, *found)))
            if lenient:
                resolved[tool] = placeholder
            continue
        resolved[tool] = path
    if dep.router.api_key_file is not None:
        # The router's and the fallback's units run it with the SGLang Python: it must be in their view.
        launcher = default_keyed_launcher()
        hidden = unreachable(launcher, ("router", "fallback"), "read")
        if hidden:
            problems.append(("keyed_launcher", Problem(
                "(pdserve's keyed launcher)", launcher, hidden[0],
                "install pdserve outside that directory; its keyed launcher runs in the units that hold the key")))
    return Toolchain(**resolved) if len(resolved) == len(_TOOLS) else None, problems
