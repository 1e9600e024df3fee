"""The SGLang Python a deployment runs: does it exist, does it run, does it hold the pinned packages.

`render` and `check` ask it (one subprocess with a deadline, reading package metadata only: seconds, not a
CUDA start) for the versions of the pinned sglang and router (pdserve.schema.pins) and, where the deployment
moves KV with NIXL, of NIXL's CUDA build. Each finding is one problem naming where the Python came from
(--sglang-python, tools.sglang_python, tools.sglang_venv), the Python, what is wrong and the command that
fixes it; a Python that cannot run is that one problem, never one more per package.
"""

from __future__ import annotations

import errno
import json
import subprocess

from pdserve.render.toolchain import DEFAULT_VENV, create_command, install_command, venv_for
from pdserve.schema import pins
from pdserve.schema.config import Deployment
from pdserve.schema.problems import Problem, Severity

VERSION_TIMEOUT_SEC = 60.0


def needs_nixl(dep: Deployment) -> bool:
    return dep.transfer.backend == "nixl"


def _packages(dep: Deployment) -> list[tuple[str, str]]:
    """(distribution, pinned version) the deployment's SGLang Python must hold."""
    found = [("sglang", pins.SGLANG_VERSION), (pins.ROUTER_DISTRIBUTION, pins.ROUTER_VERSION)]
    return found + ([(pins.NIXL_DISTRIBUTION, pins.NIXL_VERSION)] if needs_nixl(dep) else [])


def _others(origin: str) -> str:
    return ", ".join(n for n in ("tools.sglang_python", "tools.sglang_venv", "--sglang-python") if n != origin)


def _missing(origin: str, python: str, why: str, nixl: bool) -> Problem:
    made = f"{venv_for(python)}/bin/python"
    then = "" if made == python else f", and point {origin} at {made}"
    return Problem(origin, python, f"the SGLang Python {why}",
                   f"make it: `{create_command(python, nixl)}`{then}; or point {origin} (or {_others(origin)}) at "
                   "the Python of an environment that has them")


def cannot_run(origin: str, python: str, why: str, nixl: bool = True) -> Problem:
    """The SGLang Python exists but did not do what it was asked (`why`)."""
    return Problem(origin, python, f"the SGLang Python {why}",
                   f"repair or remake that environment: `{install_command(python, nixl)}`, or point {origin} (or "
                   f"{_others(origin)}) at another one")


# Asks for installed versions without importing sglang (seconds, not a CUDA init). The names arrive as argv.
_VERSIONS = (
    "import importlib.metadata as m, json, sys\n"
    "def v(name):\n"
    "    try:\n        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n        return None\n"
    "print(json.dumps({'venv': sys.prefix != sys.base_prefix, 'versions': {n: v(n) for n in sys.argv[1:]}}))\n"
)


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be run (not executable by this user)"
    if exc.errno == errno.ENOEXEC:
        return "cannot be run (not a program this machine runs)"
    return f"cannot be run here: {exc.strerror or exc}"


def package_problems(dep: Deployment, python: str, origin: str, *, nixl_severity: Severity = Severity.ERROR,
                     timeout: float = VERSION_TIMEOUT_SEC) -> list[Problem]:
    """Problems with the SGLang Python: one if it is missing or cannot run, else one per pinned package it
    lacks or holds in another version. A missing NIXL has `nixl_severity` (a warning off the target, where
    nothing will run this Python)."""
    nixl = needs_nixl(dep)
    packages = _packages(dep)
    try:
        done = subprocess.run([python, "-c", _VERSIONS, *(name for name, _ in packages)], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except OSError as exc:
        reason = _os_reason(exc)
        if exc.errno == errno.ENOENT:
            return [_missing(origin, python, reason, nixl)]
        return [cannot_run(origin, python, reason, nixl)]
    except subprocess.TimeoutExpired:
        return [cannot_run(origin, python, f"did not say its package versions within {timeout:.0f} s", nixl)]
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        found, in_venv = answer["versions"], answer["venv"] is True
    except (IndexError, KeyError, TypeError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [cannot_run(origin, python, f"failed when asked its package versions: {tail}", nixl)]
    # One problem per severity, however many packages it names: one install command fixes them all.
    findings: dict[Severity, list[str]] = {}
    for name, pin in packages:
        version = found.get(name) if isinstance(found, dict) else None
        if version != pin:
            has = f"{name} {version}" if version else f"no {name}"
            severity = nixl_severity if name == pins.NIXL_DISTRIBUTION else Severity.ERROR
            findings.setdefault(severity, []).append(f"{has} (pinned: {pin})")
    problems = []
    for severity, lacks in sorted(findings.items()):
        nixl_only = severity != Severity.ERROR
        why = ("KV moves with NIXL (transfer.backend = \"nixl\"), which the servers would fail to load where this "
               "Python runs them" if nixl_only else "the units would run this Python")
        # A system Python is not pip's to change (Debian refuses, PEP 668): an environment of its own is.
        fix = (f"`{install_command(python, nixl)}`, or point {origin} (or {_others(origin)}) at an environment that "
               "has them" if in_venv else
               f"make an environment of its own: `{create_command(DEFAULT_VENV + '/bin/python', nixl)}`, and point "
               f"{origin} at {DEFAULT_VENV}/bin/python")
        problems.append(Problem(origin, python, f"has {', '.join(lacks)}: {why} (pins: pdserve.schema.pins)", fix,
                                severity))
    return problems
