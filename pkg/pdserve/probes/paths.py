"""Facts about a path on this host: where its links lead, whether this process could write there, what
kind of file it is.

The cutover asks them of the unit directory and each unit's file (on NixOS both lead into the read-only
Nix store); `pdserve check` asks of the tools, the model directory and the key file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PathFacts:
    """One path as systemd names it, where its links lead, and whether it can be written."""

    path: str
    resolved: str
    read_only: bool  # this process cannot write there: a read-only mount, or (denied) not for this user
    denied: bool = False  # the mount is writable, but this user may not write there (permissions)


def path_facts(path: str) -> PathFacts | None:
    """Where `path`'s links lead and whether this process could write there: a read-only mount (the
    Nix store, a bind mount, `ro` in fstab) and a directory this user may not write both count, and
    the facts say which of the two it is."""
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    where = resolved if resolved.is_dir() else resolved.parent
    try:
        mounted_read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        mounted_read_only = False  # not known: what this user may do still is
    denied = not mounted_read_only and not os.access(where, os.W_OK)
    return PathFacts(path, str(resolved), mounted_read_only or denied, denied)


def is_executable_file(path: str) -> bool:
    """A regular file (after links) this process may execute."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def is_directory(path: str) -> bool:
    return Path(path).is_dir()


def file_mode(path: str) -> int | None:
    """st_mode of `path` (after links); None when it cannot be stat'ed (missing, or not ours to see)."""
    try:
        return Path(path).stat().st_mode
    except OSError:
        return None


def systemd_running() -> bool:
    """sd_booted(3)'s test: systemd is this host's init."""
    return Path("/run/systemd/system").is_dir()
