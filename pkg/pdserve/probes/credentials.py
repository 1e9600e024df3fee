"""The router's API key, read the one way every pdserve command reads it.

Run by systemd with LoadCredential=NAME:PATH, the key is at $CREDENTIALS_DIRECTORY/NAME, readable by
the unit's user only; anywhere else it is the configured file itself (which needs root, or its owner).
Either way the file must be a regular file of at most MAX_KEY_BYTES: a FIFO would block the read forever
and a mistaken path (a model file, /dev/zero) must not be read whole into memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_KEY_BYTES = 4096


class CredentialError(Exception):
    """The key cannot be read; the message names the file and what is wrong with it. `unreadable`: the
    file could not be opened or read (often: not this user's to read), rather than holding no key."""

    def __init__(self, message: str, unreadable: bool = False):
        super().__init__(message)
        self.unreadable = unreadable


def credential_path(path: str, credential: str | None) -> str:
    """$CREDENTIALS_DIRECTORY/credential when systemd passed that credential to this process, else `path`."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if credential and directory:
        passed = Path(directory) / credential
        try:
            os.stat(passed)
        except (FileNotFoundError, NotADirectoryError):
            return path
        except OSError:
            # There, but this process may not look (seen on a host whose systemd left an ExecStartPost= gate
            # without access to its unit's credentials): reading it fails with the reason and the path named,
            # which callers handle, instead of an internal error here.
            pass
        return str(passed)
    return path


def stand_in_credential(credential: str, stand_in: str) -> bool:
    """True when systemd passed this credential as the unit's SetCredential= stand-in: the LoadCredential=
    file was not there when the unit started (render.units.service_section)."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return False
    try:
        with open(Path(directory) / credential, "rb") as passed:
            return passed.read(len(stand_in) + 1) == stand_in.encode()
    except OSError:
        return False


def read_key(path: str, credential: str | None = None, what: str = "the API key file") -> str:
    """The key in `path` (or in the systemd credential of that name), stripped of surrounding whitespace."""
    where = credential_path(path, credential)
    try:
        # O_NONBLOCK: opening a FIFO nobody writes returns at once instead of waiting for a writer.
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CredentialError(f"cannot read {what} {where}: {exc.strerror}", unreadable=True) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CredentialError(f"{what} {where} is not a regular file; write the key into a plain file")
        raw = os.read(fd, MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise CredentialError(f"cannot read {what} {where}: {exc.strerror}", unreadable=True) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_KEY_BYTES:
        raise CredentialError(f"{what} {where} is larger than {MAX_KEY_BYTES} bytes: an API key is one short "
                              "line; is this the right file?")
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CredentialError(f"{what} {where} is not UTF-8 text; write the key as one line of text") from None
    if not key:
        raise CredentialError(f"{what} {where} is empty; write the key into it")
    return key
