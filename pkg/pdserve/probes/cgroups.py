"""Processes and systemd units through cgroups: which unit holds a pid, which pids a unit's cgroup holds.

The unit of a pid is read the way systemd itself reads it (sd_pid_get_unit(3), what `ps -o unit` and
`systemctl status PID` show): take the process's path in systemd's hierarchy, skip the slices, and the
first component left is the unit, a `.service` or a `.scope`. A process in a user's session or app
scope below user@UID.service therefore belongs to user@UID.service, the system unit that runs it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# systemd.unit(5): unit names are ASCII letters, digits, ":", "-", "_", ".", "\" (escapes) and "@" (templates).
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+\.(?:service|scope)")
_SLICE = re.compile(r"[A-Za-z0-9:_.\\@-]+\.slice")
# Where a unit's cgroup.procs lives: cgroup v2 (unified), then the v1 systemd hierarchy, then hybrid's v2.
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")


def unit_of_cgroup_path(path: str) -> str | None:
    """`/system.slice/sglang-dsv4-prefill.service` -> `sglang-dsv4-prefill.service`; None when the path
    names no unit (`/`, a container runtime's own tree)."""
    for part in path.split("/"):
        if not part or _SLICE.fullmatch(part):
            continue
        return part if _UNIT.fullmatch(part) else None
    return None


def systemd_cgroup_path(proc_cgroup: str) -> str | None:
    """The path in systemd's hierarchy from the text of /proc/PID/cgroup: the cgroup v2 line (`0::PATH`),
    else the v1 `name=systemd` line; another v1 controller's path is not systemd's to name."""
    unified = named = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = path
        elif "name=systemd" in controllers.split(","):
            named = path
    return unified if unified not in (None, "/") else named or unified


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd unit whose cgroup holds `pid`, with its suffix (`x.service`, `session-3.scope`), or None
    (no such process, not readable, or in no unit)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    path = systemd_cgroup_path(text)
    return unit_of_cgroup_path(path) if path else None


def cgroup_pids(control_group: str, roots: tuple[str, ...] = CGROUP_ROOTS) -> list[int]:
    """Every process in a unit's cgroup (its ControlGroup= as `systemctl show` reports it)."""
    for root in roots:
        path = os.path.join(root, control_group.lstrip("/"), "cgroup.procs")
        try:
            with open(path, encoding="ascii") as handle:
                return [int(line) for line in handle if line.strip()]
        except OSError:
            continue
    return []
