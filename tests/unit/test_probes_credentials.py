"""The one API-key reader (verify and cutover): the credential file or systemd's $CREDENTIALS_DIRECTORY,
a bounded read, and an error that names the file and what is wrong."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pdserve.probes.credentials import MAX_KEY_BYTES, CredentialError, read_key


def write(path: Path, data: bytes | str) -> str:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def test_the_key_is_the_file_stripped(tmp_path: Path):
    assert read_key(write(tmp_path / "k", "  sk-test-123\n")) == "sk-test-123"


def test_systemds_credential_wins_when_passed_to_this_process(tmp_path: Path, monkeypatch):
    configured = write(tmp_path / "router.key", "from-the-file\n")
    creds = tmp_path / "creds"
    creds.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    # The credential of that name is not there: the configured file is read.
    assert read_key(configured, "api-key") == "from-the-file"
    write(creds / "api-key", "from-the-credential\n")
    assert read_key(configured, "api-key") == "from-the-credential"
    assert read_key(configured) == "from-the-file"  # no credential name: the file, always
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert read_key(configured, "api-key") == "from-the-file"


def test_a_passed_credential_this_process_may_not_look_at_is_a_named_error_not_a_crash(tmp_path: Path, monkeypatch):
    """A gate whose unit's credential directory it cannot search (stat says EACCES) gets the reader's error,
    naming the credential's path, which its callers handle; not a PermissionError out of the path choice.
    Tests run as root, whom permissions do not stop: the refusals are made by the operating system's calls."""
    configured = write(tmp_path / "router.key", "from-the-file\n")
    creds = tmp_path / "creds"
    creds.mkdir()
    passed = write(creds / "api-key", "from-the-credential\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    real_stat, real_open = os.stat, os.open

    def refusing_stat(path, *args, **kwargs):
        if str(path) == passed:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    def refusing_open(path, *args, **kwargs):
        if str(path) == passed:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", refusing_stat)
    assert read_key(configured, "api-key") == "from-the-credential"  # stat refused, reading allowed: read
    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(CredentialError) as caught:
        read_key(configured, "api-key")
    assert str(caught.value) == f"cannot read the API key file {passed}: Permission denied"


@pytest.mark.parametrize("content,message", [
    ("\n  \n", "the API key file {path} is empty; write the key into it"),
    (b"\xff\xfe key", "the API key file {path} is not UTF-8 text"),
    ("x" * (MAX_KEY_BYTES + 1), f"the API key file {{path}} is larger than {MAX_KEY_BYTES} bytes"),
])
def test_a_file_that_holds_no_key_says_what_it_holds(tmp_path: Path, content, message):
    path = write(tmp_path / "k", content)
    with pytest.raises(CredentialError) as caught:
        read_key(path)
    assert str(caught.value).startswith(message.format(path=path)) and not caught.value.unreadable


def test_a_key_of_the_largest_size_is_read(tmp_path: Path):
    assert read_key(write(tmp_path / "k", "k" * MAX_KEY_BYTES)) == "k" * MAX_KEY_BYTES


def test_a_missing_file_or_a_directory_is_named(tmp_path: Path):
    with pytest.raises(CredentialError,
                       match=f"cannot read router.api_key_file {tmp_path}/absent: No such file") as caught:
        read_key(str(tmp_path / "absent"), what="router.api_key_file")
    assert caught.value.unreadable
    with pytest.raises(CredentialError, match="is not a regular file"):
        read_key(str(tmp_path))


def test_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_error_of(str(fifo))), daemon=True)
    reader.start()
    reader.join(10)  # a blocking open would still wait for a writer here
    assert not reader.is_alive() and "is not a regular file" in str(outcome[0])


def test_dev_zero_is_not_read_whole():
    assert "is not a regular file" in _error_of("/dev/zero")


def _error_of(path: str) -> str:
    try:
        read_key(path)
    except CredentialError as exc:
        return str(exc)
    return "no error"
