"""Facts about a path on this host: where its links lead, and whether this process could write there.

The cutover asks them of the unit directory and each unit's file (on NixOS both lead into the read-only
Nix store)."""

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
