"""Which paths the rendered units cannot reach, read off the sandbox they render (pdserve.render.hardening),
and the rule that refuses a deployment path a unit would have to execute or read there.

A tool under /tmp passes every syntax check and renders into a unit that loads, yet PrivateTmp=yes gives
the service its own empty /tmp: it fails at start with 203/EXEC. What each directive hides is systemd's
(systemd.exec(5)); which directives a unit has is hardening.sandbox()'s, so relaxing or tightening the
sandbox there changes what is refused here, with no second list to keep in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pdserve.render.hardening import sandbox
from pdserve.schema.config import ROLES, SERVER_ROLES, Deployment, Role
from pdserve.schema.problems import Problem


@dataclass(frozen=True)
class Hiding:
    """What one directive, with one value, hides from a unit's processes."""

    what: str  # how systemd.exec(5) puts it, for the message
    paths: tuple[str, ...]
    except_for: tuple[str, ...] = ()  # paths under `paths` that stay visible


_HOMES = ("/home", "/root", "/run/user")
# (directive, value) -> what the unit no longer sees. Read-only mounts (ProtectSystem=strict, ProtectHome=
# read-only, ProtectKernelTunables=, ProtectControlGroups=) are not here: they stop writes only, and a unit
# executes or reads the paths of a deployment, it never writes them.
HIDES: dict[tuple[str, str], Hiding] = {
    ("PrivateTmp", "yes"): Hiding("gives each unit its own empty /tmp and /var/tmp", ("/tmp", "/var/tmp")),
    ("ProtectHome", "yes"): Hiding("makes /home, /root and /run/user empty and inaccessible", _HOMES),
    ("ProtectHome", "tmpfs"): Hiding("mounts empty file systems over /home, /root and /run/user", _HOMES),
    # A fresh /dev with the API devices only; /dev/shm, /dev/pts, /dev/mqueue and /dev/hugepages are
    # bound in from the host.
    ("PrivateDevices", "yes"): Hiding(
        "gives the unit a private /dev with only the API devices", ("/dev",),
        ("/dev/shm", "/dev/pts", "/dev/mqueue", "/dev/hugepages", "/dev/null", "/dev/zero", "/dev/full",
         "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/stdin", "/dev/stdout", "/dev/stderr",
         "/dev/fd")),
    ("ProtectKernelModules", "yes"): Hiding("makes the kernel module directories inaccessible",
                                           ("/usr/lib/modules", "/lib/modules")),
    ("ProtectKernelLogs", "yes"): Hiding("makes the kernel log inaccessible", ("/proc/kmsg", "/dev/kmsg")),
}
# Directives that hide no path (or only make paths read-only, see HIDES). Every directive hardening renders
# is in HIDES or here (tests/unit/test_paths_reach.py): a new one must be classified before it ships.
NO_PATH_EFFECT = frozenset({
    "NoNewPrivileges", "CapabilityBoundingSet", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateMounts",
    "ProtectClock", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
    "ProtectHostname", "ProtectProc", "LockPersonality", "RestrictRealtime", "RestrictSUIDSGID",
    "RestrictNamespaces", "SystemCallArchitectures", "UMask", "PrivateDevices", "DevicePolicy", "DeviceAllow",
    "ProcSubset", "RestrictAddressFamilies", "SystemCallFilter", "SystemCallErrorNumber",
    "MemoryDenyWriteExecute", "PrivateUsers",
})
# Directories every user may create files in. A key file there can be planted by anyone before its owner
# writes it (the sticky bit stops deletion, not creation), and systemd-tmpfiles ages it out.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def normalized(path: str) -> str:
    """`path` with '.', '..' and repeated '/' resolved by name, as `/tmp/../opt` is `/opt` once the unit
    walks it (/tmp exists in every unit): the form the sandbox is compared with."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in {"", "."}:
            parts.append(part)
    return "/" + "/".join(parts)


def under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _hidden_by(path: str, role: Role) -> tuple[str, str, Hiding, str] | None:
    """(directive, value, what it hides, the hidden directory) of the first directive of `role`'s unit
    that hides `path`."""
    where = normalized(path)
    for directive, value in sandbox(role):
        hiding = HIDES.get((directive, value))
        if hiding is None:
            continue
        for hidden in hiding.paths:
            if under(where, hidden) and not any(under(where, kept) for kept in hiding.except_for):
                return directive, value, hiding, hidden
    return None


def unreachable(path: str, roles: Iterable[Role], verb: str) -> tuple[str, str] | None:
    """(message, fix) when a unit of one of `roles` could not `verb` ("execute", "read") `path`; None
    when every one of them can reach it. Relative paths (a hub id, a bare name) are not judged here."""
    if not path.startswith("/"):
        return None
    for role in roles:
        found = _hidden_by(path, role)
        if found is None:
            continue
        directive, value, hiding, hidden = found
        unit = "router unit" if role == "router" else f"{role} unit"
        failure = ("the service fails to start (status 203/EXEC)" if verb == "execute"
                   else f"the service cannot {verb} it")
        return (f"is under {hidden}, which the rendered {unit} cannot see: its {directive}={value} {hiding.what}, "
                f"so {failure}",
                f"move it out of {hidden} (e.g. under /opt or /var/lib) and give that path")
    return None


def runners(dep: Deployment) -> tuple[Role, ...]:
    """The roles whose units the deployment renders."""
    return tuple(role for role in ROLES if role != "fallback" or dep.fallback is not None)


def gpu_servers(dep: Deployment) -> tuple[Role, ...]:
    return tuple(role for role in SERVER_ROLES if role != "fallback" or dep.fallback is not None)


def deployment_paths(dep: Deployment) -> Iterator[tuple[str, str, tuple[Role, ...], str]]:
    """(field, path, the roles whose units use it, how they use it) of every path of the deployment a
    unit executes or reads in its sandbox. Not router.api_key_file: systemd reads it (LoadCredential=)
    before the sandbox is set up."""
    tools = dep.tools
    every = runners(dep)
    if tools.sglang_python:
        yield "tools.sglang_python", tools.sglang_python, every, "execute"
    if tools.sglang_venv:
        yield "tools.sglang_venv", tools.sglang_venv, every, "execute"  # and its bin/python
    if tools.pdserve:
        yield "tools.pdserve", tools.pdserve, every, "execute"  # the readiness gates of every unit
    if tools.numactl:
        yield "tools.numactl", tools.numactl, gpu_servers(dep), "execute"
    if dep.model.path.startswith("/"):
        yield "model.path", dep.model.path, gpu_servers(dep), "read"
    if dep.model.chat_template and dep.model.chat_template.startswith("/"):
        yield "model.chat_template", dep.model.chat_template, gpu_servers(dep), "read"


def key_file_problem(path: str) -> tuple[str, str] | None:
    """(message, fix) when the API key file sits where any user can create it."""
    where = normalized(path)
    shared = next((d for d in SHARED_WRITABLE if under(where, d)), None)
    if shared is None:
        return None
    return (f"is under {shared}, where every user may create files: anyone can create it before you do and choose "
            "the key the router accepts; and files there do not last (systemd-tmpfiles ages them out, a reboot "
            "empties a tmpfs)",
            "keep the key in a directory only root can write, e.g. /etc/pdserve/router.key (mode 0600)")


def paths_within_reach(dep: Deployment) -> Iterator[Problem]:
    """A render rule (pdserve.render.renderable): every path a unit needs is one it can reach."""
    for field, path, roles, verb in deployment_paths(dep):
        found = unreachable(path, roles, verb)
        if found:
            yield Problem(field, path, *found)
    key = dep.router.api_key_file
    if key is not None:
        found = key_file_problem(key)
        if found:
            yield Problem("router.api_key_file", key, *found)
