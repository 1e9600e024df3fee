"""Paths the rendered units cannot reach (issue 37, item 5): a tool, the model or the key file where the
units' sandbox hides it is refused by `check` and `render` (which then writes nothing), with the directive
that hides it, read off pdserve.render.hardening."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render import hardening, reach, toolchain
from pdserve.schema.config import ROLES

# Every path field of a deployment a unit executes or reads, and where in the data it is written.
PATH_FIELDS = {
    "tools.sglang_python": ("tools", "sglang_python", "venv/bin/python"),
    "tools.sglang_venv": ("tools", "sglang_venv", "venv"),
    "tools.numactl": ("tools", "numactl", "bin/numactl"),
    "tools.pdserve": ("tools", "pdserve", "bin/pdserve"),
    "model.path": ("model", "path", "models/dsv4"),
    "model.chat_template": ("model", "chat_template", "templates/chat.jinja"),
}
TOOL_FLAGS = {"tools.sglang_python": "--sglang-python", "tools.numactl": "--numactl", "tools.pdserve": "--pdserve"}


def write(tmp_path: Path, data) -> str:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    return str(path)


def check(*args: str):
    return CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", *args])


def render(tmp_path: Path, *args: str):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", "/opt/sglang/bin/python",
                                       "--numactl", "/usr/bin/numactl", "--pdserve", "/opt/pdserve/bin/pdserve",
                                       "--no-python-check", *args])
    return result, out


def errors_of(result, field: str) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith(f"error: {field} = ")]


def set_path(data, field: str, value: str) -> None:
    section, key, _ = PATH_FIELDS[field]
    data.setdefault(section, {})[key] = value


def test_every_directive_the_units_render_is_classified():
    # A directive that hardening starts to render must be placed in reach.HIDES or reach.NO_PATH_EFFECT
    # first: otherwise a path it hides would pass `check`.
    rendered = {directive for role in ROLES for directive, _ in hardening.sandbox(role)}
    unknown = rendered - reach.NO_PATH_EFFECT - {directive for directive, _ in reach.HIDES}
    assert unknown == set(), f"classify {sorted(unknown)} in pdserve.render.reach"


@pytest.mark.parametrize("hidden", ["/tmp", "/var/tmp"])
@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
def test_a_path_under_the_private_tmp_is_refused_by_check_and_render(tmp_path, reference_data, field, hidden):
    value = f"{hidden}/pdserve-test/{PATH_FIELDS[field][2]}"
    set_path(reference_data, field, value)
    config = write(tmp_path, reference_data)
    checked = check("-c", config)
    assert checked.exit_code == 1, checked.output
    (line,) = errors_of(checked, field)
    assert f"is under {hidden}, which the rendered" in line and "PrivateTmp=yes" in line, line
    assert f"fix: move it out of {hidden}" in line
    rendered, out = render(tmp_path, "-c", config)
    assert rendered.exit_code == 1 and errors_of(rendered, field), rendered.output
    assert not out.exists()


@pytest.mark.parametrize("field", sorted(TOOL_FLAGS))
@pytest.mark.parametrize("value", ["/tmp/bin/tool", "/var/tmp/bin/tool", "/opt/../tmp/bin/tool", "//tmp/bin/tool"])
def test_a_tool_given_by_flag_under_the_private_tmp_is_refused(tmp_path, field, value):
    # Flags go into ExecStart= as the file's tools do; `/opt/../tmp` is /tmp once the unit walks it.
    flag = TOOL_FLAGS[field]
    checked = check(flag, value)
    assert checked.exit_code == 1
    (line,) = errors_of(checked, flag)
    assert "/tmp, which the rendered" in line and "PrivateTmp=yes" in line, line
    rendered, out = render(tmp_path, flag, value)
    assert rendered.exit_code == 1 and errors_of(rendered, flag) and not out.exists(), rendered.output


def test_a_tool_found_on_path_under_the_private_tmp_is_refused(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "numactl").write_text("#!/bin/sh\n")
    (bin_dir / "numactl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", "/opt/sglang/bin/python",
                                       "--pdserve", "/opt/pdserve/bin/pdserve", "--no-python-check"])
    assert result.exit_code == 1 and not out.exists()
    (line,) = errors_of(result, "tools.numactl (found on PATH)")
    assert "PrivateTmp=yes" in line


@pytest.mark.parametrize("hidden", ["/tmp", "/var/tmp", "/dev/shm"])
def test_a_key_file_where_anyone_can_create_it_is_refused(tmp_path, reference_data, hidden):
    # systemd reads it (LoadCredential=) before the sandbox exists; the danger is who else can write there.
    reference_data["router"]["api_key_file"] = f"{hidden}/router.key"
    config = write(tmp_path, reference_data)
    checked = check("-c", config)
    (line,) = errors_of(checked, "router.api_key_file")
    assert f"is under {hidden}, where every user may create files" in line and "/etc/pdserve/router.key" in line
    rendered, out = render(tmp_path, "-c", config)
    assert rendered.exit_code == 1 and not out.exists()


def test_the_keyed_launcher_of_a_pdserve_installed_under_tmp_is_refused(tmp_path, reference_data, monkeypatch):
    monkeypatch.setattr(toolchain, "default_keyed_launcher", lambda: "/tmp/venv/pdserve/launch/keyed_launch.py")
    reference_data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    rendered, out = render(tmp_path, "-c", write(tmp_path, reference_data))
    assert rendered.exit_code == 1 and not out.exists()
    (line,) = errors_of(rendered, "(pdserve's keyed launcher)")
    assert "router unit" in line and "PrivateTmp=yes" in line


@pytest.mark.parametrize("home", ["/home/ops/venv/bin/python", "/root/venv/bin/python", "/run/user/1000/python"])
def test_homes_follow_the_rendered_protecthome(tmp_path, reference_data, monkeypatch, home):
    # Rendered: ProtectHome=read-only, so a Python under a home directory runs (read and execute pass).
    reference_data["tools"] = {"sglang_python": home}
    config = write(tmp_path, reference_data)
    assert ("ProtectHome", "read-only") in hardening.COMMON
    assert check("-c", config).exit_code == 0
    # Tightened to ProtectHome=yes, the same path is refused, naming the directive: one source, the sandbox.
    monkeypatch.setattr(hardening, "COMMON", [(k, "yes" if k == "ProtectHome" else v) for k, v in hardening.COMMON])
    refused = check("-c", config)
    (line,) = errors_of(refused, "tools.sglang_python")
    assert "ProtectHome=yes makes /home, /root and /run/user empty and inaccessible" in line, line
    rendered, out = render(tmp_path, "-c", config)
    assert rendered.exit_code == 1 and not out.exists()


def test_the_routers_private_dev_hides_a_tool_under_dev_but_not_dev_shm(tmp_path, reference_data):
    reference_data["tools"] = {"pdserve": "/dev/pdserve/bin/pdserve"}
    (line,) = errors_of(check("-c", write(tmp_path, reference_data)), "tools.pdserve")
    assert "rendered router unit" in line and "PrivateDevices=yes" in line, line
    reference_data["tools"] = {"pdserve": "/dev/shm/pdserve"}
    assert not errors_of(check("-c", write(tmp_path, reference_data)), "tools.pdserve")


@pytest.mark.parametrize(("path", "expected"), [
    ("/tmp/../opt/x", "/opt/x"), ("/opt/../tmp/x", "/tmp/x"), ("//tmp//x/", "/tmp/x"), ("/./var/tmp/.", "/var/tmp"),
    ("/../../tmp", "/tmp"),
])
def test_paths_are_compared_as_the_unit_walks_them(path, expected):
    assert reach.normalized(path) == expected


def test_paths_outside_the_hidden_directories_pass(tmp_path, reference_data):
    for field, (_, _, tail) in PATH_FIELDS.items():
        if field != "tools.sglang_python":
            set_path(reference_data, field, f"/opt/tmp/{tail}")  # "tmp" deeper down hides nothing
    reference_data["model"]["path"] = "/tmpfs-models/dsv4"      # nor a name that starts with "tmp"
    reference_data["router"]["api_key_file"] = "/etc/pdserve/tmp.key"
    checked = check("-c", write(tmp_path, reference_data))
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
@pytest.mark.parametrize("value", ["/tmp/../opt/x", "/opt/./x", "/opt//x", "/opt/x/", "/opt/x/.."])
def test_a_path_field_with_dot_components_is_refused_as_written(tmp_path, reference_data, field, value):
    # Refused, not normalized: the path checked against the sandbox is then the one the unit runs.
    set_path(reference_data, field, value)
    (line,) = errors_of(check("-c", write(tmp_path, reference_data)), field)
    assert ("'.', '..', '//' or a trailing '/'" in line or "ends in '/'" in line) and "fix: " in line, line
