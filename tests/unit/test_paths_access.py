"""What the units' user may execute and read, on this host (issue 37, item 5): the kernel is asked in a
process running as that user (here the real system user `nobody`), every directory above a path counts,
links are followed, and a refusal names the user, the component that stops it and the fix."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.check.access import check_access, unit_paths
from pdserve.probes import paths
from pdserve.render.toolchain import Toolchain
from pdserve.schema.loading import deployment_from_data

NOBODY = "nobody"
OTHER_GID = 54321  # a group nobody is not in (the kernel needs no name for it)


def _nobody() -> paths.Account:
    if os.geteuid() != 0:
        pytest.skip("acting as another user (nobody) needs root")
    try:
        entry = pwd.getpwnam(NOBODY)
    except KeyError:
        pytest.skip("this host has no user nobody")
    return paths.Account(NOBODY, entry.pw_uid, entry.pw_gid, (entry.pw_gid,))


@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory tree every user may enter, owned by root (pytest's tmp_path lies under a 0700 directory
    nobody cannot pass, which would stop every walk at the same place)."""
    root = Path(tempfile.mkdtemp(prefix="pdserve-access-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make(path: Path, mode: int, text: str = "#!/bin/sh\n") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_kernel_answers_as_the_user(tree):
    nobody = _nobody()
    ok_tool = make(tree / "bin" / "tool", 0o755)
    (tree / "bin").chmod(0o755)
    private = tree / "private"
    locked_tool = make(private / "tool", 0o755)
    private.chmod(0o700)
    unreadable = make(tree / "bin" / "secret", 0o600)
    not_executable = make(tree / "bin" / "plain", 0o644)
    model = tree / "model"
    make(model / "config.json", 0o644, "{}")
    shard = make(model / "model-00001.safetensors", 0o600, "x")
    model.chmod(0o755)
    answers = paths.reach_as(nobody, [
        (ok_tool, "execute"), (locked_tool, "execute"), (unreadable, "read"), (not_executable, "execute"),
        (str(model), "read-dir"), (str(tree / "absent" / "tool"), "execute"),
    ])
    assert not isinstance(answers, str), answers
    ok, locked, secret, plain, model_dir, absent = answers
    assert ok.ok
    assert not locked.ok and locked.blocked_at == str(private) and "may not enter" in locked.why
    assert not secret.ok and secret.blocked_at == unreadable and "may not be read" in secret.why
    assert not plain.ok and "may not be executed" in plain.why
    assert not model_dir.ok and model_dir.blocked_at == shard
    assert absent.missing and not absent.ok


def test_the_units_groups_count(tree):
    nobody = _nobody()
    shared = tree / "shared"
    tool = make(shared / "tool", 0o750)
    os.chown(tool, 0, OTHER_GID)
    shared.chmod(0o750)
    os.chown(shared, 0, OTHER_GID)
    (denied,) = paths.reach_as(nobody, [(tool, "execute")])  # type: ignore[misc]
    assert not denied.ok and denied.blocked_at == str(shared)
    member = paths.Account(nobody.user, nobody.uid, nobody.gid, (*nobody.groups, OTHER_GID))
    (allowed,) = paths.reach_as(member, [(tool, "execute")])  # type: ignore[misc]
    assert allowed.ok


def test_only_root_can_ask_for_another_user(monkeypatch):
    nobody = paths.Account(NOBODY, 65534, 65534, (65534,))
    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(paths.os, "getegid", lambda: 1000)
    answer = paths.reach_as(nobody, [("/usr/bin/env", "execute")])
    assert answer == "only root can act as user nobody, and this check runs as uid 1000"


def deployment(reference_data, tree: Path | None = None, **systemd):
    reference_data["systemd"] = {"user": NOBODY, "group": "nogroup", **systemd}
    if tree is not None:
        reference_data["model"]["path"] = str(tree / "model")
    return deployment_from_data(reference_data, "t").deployment


def tools_in(directory: Path) -> Toolchain:
    names = ("python", "numactl", "pdserve")
    return Toolchain(*(make(directory / name, 0o755) for name in names), keyed_launcher="/usr/bin/env")


def test_check_names_the_user_the_component_and_the_fix(tree, reference_data):
    _nobody()
    venv = tree / "venv"
    tools = tools_in(venv / "bin")
    venv.chmod(0o700)  # made by root with umask 077: the units' user cannot pass it
    model = tree / "model"
    make(model / "config.json", 0o644, "{}")
    shard = make(model / "model-00001.safetensors", 0o600, "x")
    model.chmod(0o755)
    problems: list = []
    passed: list = []
    skipped: list = []
    check_access(deployment(reference_data, tree), tools, problems, passed, skipped)
    found = {p.field: p for p in problems}
    python = found["tools.sglang_python"]
    assert python.message.startswith(f"user nobody (the units' User=) cannot execute: {venv} is a directory it may "
                                      "not enter") and "(mode 0700, owner root:root)" in python.message, python.message
    assert python.fix == f"let nobody pass {venv}: chmod o+x {venv}, or give it a group nobody is in (g+x)"
    assert {"tools.pdserve", "tools.numactl"} <= set(found)
    model_problem = found["model.path"]
    assert f"cannot read the directory: {shard} may not be read by it" in model_problem.message
    assert model_problem.fix == f"chmod o+r {shard}, or give it a group nobody is in (g+r)"
    assert not passed and not skipped


def test_check_passes_what_the_user_can_reach(tree, reference_data):
    _nobody()
    tools = tools_in(tree / "bin")
    make(tree / "model" / "config.json", 0o644, "{}")
    problems: list = []
    passed: list = []
    check_access(deployment(reference_data, tree), tools, problems, passed, [])
    assert problems == [] and passed and "user nobody may execute the tools and read the model" in passed[0]


def test_a_link_into_the_private_tmp_is_refused(tmp_path, visible_tmp_path, reference_data):
    # The path in the file passes the sandbox by name; the venv's python it links to does not.
    target = make(tmp_path / "python3.12", 0o755)
    link = visible_tmp_path / "venv" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    tools = Toolchain(str(link), "/usr/bin/env", "/usr/bin/env", "/usr/bin/env")
    problems: list = []
    check_access(deployment(reference_data), tools, problems, [], [])
    (problem,) = [p for p in problems if p.field == "tools.sglang_python" and "link" in p.message]
    assert problem.message.startswith(f"leads (through a link) to {target}: it is under /tmp") and \
        "PrivateTmp=yes" in problem.message


def test_a_missing_user_is_a_warning_and_a_stated_skip(reference_data):
    dep = deployment(reference_data, user="pdserve-no-such-user")
    problems: list = []
    skipped: list = []
    check_access(dep, tools_in_place(), problems, [], skipped)
    (problem,) = [p for p in problems if p.field == "systemd.user"]
    assert problem.severity == "warning" and "there is no user pdserve-no-such-user on this host" in problem.message
    assert "useradd --system --user-group pdserve-no-such-user" in problem.fix
    assert skipped == ["what user pdserve-no-such-user may execute and read: there is no user pdserve-no-such-user "
                       "on this host"]


def tools_in_place() -> Toolchain:
    return Toolchain("/usr/bin/env", "/usr/bin/env", "/usr/bin/env", "/usr/bin/env")


def test_the_paths_asked_about_follow_the_deployment(reference_data):
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    reference_data["model"]["chat_template"] = "/etc/pdserve/template.jinja"
    rows = {field: need for field, _, need, _ in unit_paths(deployment(reference_data), tools_in_place())}
    # The key file is read by systemd as root (LoadCredential=), so it is not asked about as the user.
    assert rows == {"tools.sglang_python": "execute", "tools.pdserve": "execute", "tools.numactl": "execute",
                    "(pdserve's keyed launcher)": "read", "model.path": "read-dir", "model.chat_template": "read"}


def test_check_on_the_host_refuses_a_python_its_user_cannot_reach(visible_tmp_path, reference_data, monkeypatch):
    # A venv under root's home: ProtectHome=read-only leaves it in the units' view, but /root (0700) stops
    # the units' user before the sandbox matters. Through the CLI, as a user runs it on the target.
    import json

    from click.testing import CliRunner

    from pdserve.check import run as check_run
    from pdserve.cli.main import main
    from tests.unit.test_cli_check_host import TARGET, reading

    _nobody()
    blocker = next((str(p) for p in reversed(visible_tmp_path.parents) if not os.stat(p).st_mode & 0o001), None)
    if blocker is None:
        pytest.skip(f"every directory above {visible_tmp_path} lets others pass")
    python = make(visible_tmp_path / "venv" / "bin" / "python", 0o755)
    reference_data["systemd"] = {"user": NOBODY, "group": "nogroup"}
    config = visible_tmp_path / "d.json"
    config.write_text(json.dumps(reference_data))
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    result = CliRunner().invoke(main, ["check", "--host", "--no-parsers", "-c", str(config), "--sglang-python", python])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: tools.sglang_python")]
    assert f"user nobody (the units' User=) cannot execute: {blocker} is a directory it may not enter" in line
    assert f"fix: let nobody pass {blocker}: chmod o+x {blocker}" in line


def test_a_walk_that_hangs_is_cut_off_at_the_deadline(monkeypatch):
    # A path on a hung network mount must not hang `check`: the process acting as the user is killed.
    import time

    nobody = _nobody()
    monkeypatch.setattr(paths, "_walk", lambda path, need: time.sleep(60))  # inherited by the forked child
    started = time.monotonic()
    answer = paths.reach_as(nobody, [("/usr/bin/env", "execute")], timeout=0.5)
    assert answer == "looking at the paths as user nobody took longer than the check waits"
    assert time.monotonic() - started < 10


def test_root_as_the_units_user_is_not_judged_with_this_processs_capabilities():
    # CapabilityBoundingSet= is empty in every unit: root there cannot read what root here can.
    answer = paths.reach_as(paths.Account("root", 0, 0, (0,)), [("/etc/shadow", "read")])
    assert answer == "the units run as root without capabilities, which this check cannot act as"


def test_the_paths_of_a_multi_host_file_are_listed_too():
    # One host of several runs the same tools and reads the same model (numactl: a server binds a node).
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[2] / "hosts" / "two-host" / "deployment.toml").read_text())
    data["decode"][0]["numa_node"] = 1
    data["decode"][0]["gpus"] = [4, 5, 6, 7]
    rows = [field for field, _, _, _ in unit_paths(deployment_from_data(data, "t").deployment, tools_in_place())]
    assert rows == ["tools.sglang_python", "tools.pdserve", "tools.numactl", "(pdserve's keyed launcher)", "model.path"]
