"""Facts about a path on this host: where its links lead, whether this process could write there, what
kind of file it is.

The cutover asks them of the unit directory and each unit's file (on NixOS both lead into the read-only
Nix store); `pdserve check` asks of the tools, the model directory and the key file, and asks what the
units' user may do with them (reach_as: the kernel answers, in a process running as that user)."""

from __future__ import annotations

import grp
import itertools
import json
import os
import pwd
import select
import signal
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal


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


@dataclass(frozen=True)
class Account:
    """Who a unit runs as: systemd's User=, Group=, and the supplementary groups it sets (the user's groups in
    the group database, plus SupplementaryGroups=)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def account(user: str, group: str, supplementary: list[str]) -> Account | str:
    """The account a unit with these User=/Group=/SupplementaryGroups= runs as, or why it cannot run."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"there is no user {user} on this host"
    gids = []
    for name in (group, *supplementary):
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            return f"there is no group {name} on this host"
    groups = dict.fromkeys([*os.getgrouplist(user, gids[0]), *gids[1:]])
    return Account(user, entry.pw_uid, gids[0], tuple(groups))


# What a unit does with a path: execute a file, read a file, or read a directory and the files in it.
Need = Literal["execute", "read", "read-dir"]
# A directory with more entries than this is judged by its first ones (a model has tens of files).
MAX_DIR_ENTRIES = 10_000


@dataclass(frozen=True)
class Reach:
    """Whether an account can do what it needs with a path; where the walk stopped when it cannot."""

    path: str
    need: str
    ok: bool
    missing: bool = False  # the path (or a directory on the way) does not exist
    blocked_at: str = ""  # the path component that stops the account
    why: str = ""  # what stops it there, e.g. "no search (x) permission for it"
    mode: int = 0  # st_mode, uid and gid of blocked_at, to name in the message
    uid: int = -1
    gid: int = -1


def _stopped(path: str, need: str, where: str, why: str, st: os.stat_result | None = None) -> Reach:
    return Reach(path, need, False, False, where, why, *((st.st_mode, st.st_uid, st.st_gid) if st else (0, -1, -1)))


def _walk(path: str, need: str) -> Reach:
    """As the current user: pass every directory above `path`, then do what `need` says (the kernel
    decides: permission bits, ACLs, read-only and noexec mounts)."""
    current = ""
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        current += "/" + part
        try:
            st = os.stat(current)  # through links, as execve and open go
        except FileNotFoundError:
            return Reach(path, need, False, True, current, "does not exist")
        except OSError as exc:  # a link whose target lies behind a directory it may not enter
            return _stopped(path, need, current, f"cannot be looked up ({exc.strerror})")
        if index == len(parts) - 1:
            break
        if not stat.S_ISDIR(st.st_mode):
            return _stopped(path, need, current, "is not a directory", st)
        if not os.access(current, os.X_OK):
            return _stopped(path, need, current, "is a directory it may not enter (no search permission, x)", st)
    st = os.stat(path)
    if need == "execute":
        if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):  # X_OK fails on a noexec mount too
            noexec = bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
            return _stopped(path, need, path, "is on a noexec mount" if noexec else "may not be executed by it", st)
    elif need == "read":
        if not stat.S_ISREG(st.st_mode) or not os.access(path, os.R_OK):
            return _stopped(path, need, path, "may not be read by it", st)
    elif not stat.S_ISDIR(st.st_mode) or not os.access(path, os.R_OK | os.X_OK):
        return _stopped(path, need, path, "is a directory it may not list or enter (r and x)", st)
    else:
        with os.scandir(path) as entries:
            for entry in itertools.islice(entries, MAX_DIR_ENTRIES):
                if entry.is_file() and not os.access(entry.path, os.R_OK):
                    return _stopped(path, need, entry.path, "may not be read by it", entry.stat())
    return Reach(path, need, True)


def reach_as(who: Account, checks: list[tuple[str, Need]], timeout: float = 10.0) -> list[Reach] | str:
    """What `who` can do with each (path, need), decided by the kernel in a process running as that account;
    or why it could not be asked (only root can become another user)."""
    if who.uid == 0:
        # The units have an empty CapabilityBoundingSet=: root there has no CAP_DAC_OVERRIDE, unlike here.
        return "the units run as root without capabilities, which this check cannot act as"
    if os.geteuid() == who.uid and os.getegid() == who.gid:
        return [_walk(path, need) for path, need in checks]
    if os.geteuid() != 0:
        return f"only root can act as user {who.user}, and this check runs as uid {os.geteuid()}"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the account, walk, write the answers, exit without cleanup
        code = 1
        try:
            os.close(read_end)
            os.setgroups(list(who.groups))
            os.setgid(who.gid)
            os.setuid(who.uid)
            answer = json.dumps([asdict(_walk(path, need)) for path, need in checks]).encode()
            with os.fdopen(write_end, "wb") as out:
                out.write(answer)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return _collect(pid, read_end, time.monotonic() + timeout, who.user)


def _collect(pid: int, fd: int, deadline: float, user: str) -> list[Reach] | str:
    """The child's answer, read until `deadline` (a hung network mount must not hang `check`)."""
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return f"looking at the paths as user {user} took longer than the check waits"
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    try:
        return [Reach(**item) for item in json.loads(b"".join(chunks))]
    except (ValueError, TypeError):
        return f"the process acting as user {user} gave no answer"


def resolved(path: str) -> str | None:
    """Where `path`'s links lead (the path itself when it has none); None when it does not exist."""
    try:
        return str(Path(path).resolve(strict=True))
    except (OSError, RuntimeError):
        return None


def owner(uid: int, gid: int) -> str:
    """user:group of an owner, by name where this host has one."""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return f"{user}:{group}"
