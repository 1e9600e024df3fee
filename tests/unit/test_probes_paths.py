"""probes.paths: the file facts `pdserve check` asks of the tools, the model directory and the key file,
on real files of this machine."""

from __future__ import annotations

from pdserve.probes import paths


def test_an_executable_is_a_regular_file_with_an_execute_bit(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o644)
    assert not paths.is_executable_file(str(tool))     # root too: X_OK needs some execute bit
    tool.chmod(0o755)
    assert paths.is_executable_file(str(tool))
    link = tmp_path / "link"
    link.symlink_to(tool)
    assert paths.is_executable_file(str(link))          # after links, as execve follows them
    assert not paths.is_executable_file(str(tmp_path))  # a directory has x but is no program
    assert not paths.is_executable_file(str(tmp_path / "missing"))


def test_directory_and_mode(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    key.chmod(0o640)
    assert paths.is_directory(str(tmp_path)) and not paths.is_directory(str(key))
    assert paths.file_mode(str(key)) & 0o777 == 0o640
    assert paths.file_mode(str(tmp_path / "missing")) is None
