"""Processes from /proc: who listens on a port, a process tree, its command line, its NUMA placement.
(Which unit holds a process: pdserve.probes.cgroups.)"""

from __future__ import annotations

import os
import re

from pdserve.probes.cpulist import parse_list
from pdserve.probes.observations import ProcNuma

_NODE_PAGES = re.compile(r"\bN(\d+)=(\d+)")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = _read(table) or ""
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pids(port: int) -> set[int]:
    """Processes holding a listening socket on `port` (root sees every process; others see their own)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found = set()
    for pid in _pids():
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(os.path.join(fd_dir, name)) in wanted:
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # The command may contain spaces and parentheses; fields resume after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def with_descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        parent = _ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, []))
    return seen


def command(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline")
    if raw:
        parts = [p for p in raw.split("\0") if p]
        return " ".join(parts)[:120]
    return (_read(f"/proc/{pid}/comm") or "?").strip()


def numa_of(pid: int) -> ProcNuma | None:
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    cpus = fields.get("Cpus_allowed_list")
    mems = fields.get("Mems_allowed_list")
    pages: dict[int, int] | None = None
    maps = _read(f"/proc/{pid}/numa_maps")
    if maps is not None:
        pages = {}
        for match in _NODE_PAGES.finditer(maps):
            node = int(match.group(1))
            pages[node] = pages.get(node, 0) + int(match.group(2))
    return ProcNuma(
        pid=pid,
        command=(fields.get("Name") or "?").strip(),
        cpus_allowed=parse_list(cpus) if cpus else None,
        mems_allowed=parse_list(mems) if mems else None,
        pages_by_node=pages,
    )


def executable(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
