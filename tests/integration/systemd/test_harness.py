"""The container harness's pure parts, checked without root: which mirror debootstrap uses, and what
gets bind-mounted for the Python environment."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.integration.systemd.container import PythonEnv, host_mirror


def test_mirror_comes_from_the_hosts_apt_sources(tmp_path: Path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    assert host_mirror((tmp_path / "none.list", d)) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://old.example/debian bookworm main contrib\n")
    assert host_mirror((one_line,)) == "http://old.example/debian"
    one_line.write_text("deb http://old.example/debian trixie main\n")
    assert host_mirror((one_line,)) is None


def test_python_env_binds_the_venv_repo_and_base_without_nesting():
    repo = Path(__file__).resolve().parents[3]
    env = PythonEnv.current(repo)
    assert Path(env.python).parent.parent == Path(sys.prefix)
    for bind in env.binds:
        assert not any(bind != other and Path(bind).is_relative_to(other) for other in env.binds), env.binds
    visible = [Path(b) for b in env.binds]
    assert any(Path(sys.prefix).is_relative_to(b) for b in visible)
    if env.rootfs_packages:
        assert env.rootfs_packages[0].startswith("python3.")
    else:
        assert any(Path(sys.base_prefix).resolve().is_relative_to(b) for b in visible)
