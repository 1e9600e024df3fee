"""`pdserve check` and the host: host checks run when asked or on a host that looks like the target, and
say which rule applied; the SGLang Python is given or found, never `python3` from PATH, and on the host
it must hold the pinned sglang (asked of real Pythons here: this venv's, and wrappers with other versions)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.check import run as check_run
from pdserve.check.host import HostView
from pdserve.check.target import decide
from pdserve.cli.main import main
from pdserve.schema import pins
from tests.conftest import PINNED, require_the_pins_here

TARGET = HostView(gpu_bus_ids=[f"00000000:{i:02X}:00.0" for i in range(8)], numa_nodes=[0, 1],
                  gpu_numa={i: i // 4 for i in range(8)})
LAPTOP = HostView(gpu_bus_ids=None, numa_nodes=[0], gpu_numa={})


def reading(view: HostView, systemd_missing: str | None = None) -> check_run.HostReading:
    return check_run.HostReading(lambda: systemd_missing, lambda: view)


def test_the_rule_follows_the_flags_first(reference):
    assert decide(reference, True, "systemd is not running here", LAPTOP).rule == "on (asked with --host)"
    assert decide(reference, False, None, TARGET).rule == "off (--no-host)"


@pytest.mark.parametrize(("systemd_missing", "view", "words"), [
    ("systemd is not running here", TARGET, "off: systemd is not running here; use --host to force them"),
    (None, LAPTOP, "this host has no GPU that can be read (the file names GPUs 0-7)"),
    (None, HostView(TARGET.gpu_bus_ids[:4], [0, 1], {}), "this host has 4 GPU(s), the file names GPUs 0-7"),
    (None, HostView(TARGET.gpu_bus_ids, [0], {}), "NUMA node(s) [1] the file names are not on this host (it has [0])"),
])
def test_off_the_target_the_rule_says_why(reference, systemd_missing, view, words):
    rule = decide(reference, None, systemd_missing, view)
    assert not rule.on and rule.rule.startswith("off: ") and words in rule.rule
    assert rule.rule.endswith("use --host to force them")


def test_on_a_host_like_the_target_host_checks_run(reference):
    rule = decide(reference, None, None, TARGET)
    assert rule.on and rule.rule.startswith("on (this host looks like the target: systemd is running, GPUs 0-7")


def check(*args: str):
    return CliRunner().invoke(main, ["check", *args])


def test_check_prints_the_rule_and_skips_the_host_off_target(monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(LAPTOP, "systemd is not running here"))
    result = check("--no-parsers")
    assert result.exit_code == 0, result.output
    assert "host checks: off: systemd is not running here; this host has no GPU" in result.output
    data = json.loads(check("--no-parsers", "--json").stdout)
    assert data["host_checks"]["on"] is False and "use --host to force them" in data["host_checks"]["rule"]


def test_check_on_the_target_runs_the_host_checks(monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    result = check("--no-parsers", "--json", "--sglang-python", sys.executable)
    data = json.loads(result.stdout)
    assert data["host_checks"]["on"] is True
    assert "GPU indices exist (8 GPUs)" in data["checked"]
    # --no-host still wins on the target.
    off = json.loads(check("--no-parsers", "--json", "--no-host").stdout)
    assert off["host_checks"] == {"on": False, "rule": "off (--no-host)"}


def test_check_with_host_on_a_laptop_reports_what_is_wrong_here(monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(HostView(None, [0], {}, )))
    result = check("--host", "--no-parsers")
    assert result.exit_code == 1
    assert "host checks: on (asked with --host)" in result.output
    assert "error: decode.numa_node = 1: this host has NUMA nodes [0]" in result.output
    # No SGLang Python named: said as such, not as a bare name that is "not an executable file".
    assert "error: tools.sglang_python = (unset): the Python that has sglang and the router (smg) installed " \
           "was not given (pdserve does not guess it from PATH)" in result.output


# -- the SGLang Python: pinned versions ------------------------------------------------------------

def fake_python(tmp_path: Path, versions: dict[str, str]) -> str:
    """In `tmp_path` (one the units could see: check refuses a Python under /tmp), a real Python whose installed
    distributions are `versions` (dist-info only) and nothing else: -S drops this venv's site-packages,
    PYTHONPATH brings the fake distributions."""
    site = tmp_path / "site"
    for name, version in versions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    wrapper = tmp_path / "venv" / "bin" / "python"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_this_venvs_python_has_the_pins(monkeypatch):
    require_the_pins_here()
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    data = json.loads(check("--host", "--no-parsers", "--json", "--sglang-python", sys.executable).stdout)
    assert f"--sglang-python has the pinned sglang and router (smg) and {pins.NIXL_DISTRIBUTION}" in data["checked"]
    assert not [p for p in data["problems"] if p["field"] == "--sglang-python"]


@pytest.mark.parametrize(("versions", "found"), [
    ({**PINNED, "sglang": "0.5.17"}, f"has sglang 0.5.17 (pinned: {pins.SGLANG_VERSION})"),
    ({k: v for k, v in PINNED.items() if k != "sglang"}, f"has no sglang (pinned: {pins.SGLANG_VERSION})"),
    ({"sglang": pins.SGLANG_VERSION}, f"has no {pins.ROUTER_DISTRIBUTION} (pinned: {pins.ROUTER_VERSION}), "
                                      f"no {pins.NIXL_DISTRIBUTION} (pinned: {pins.NIXL_VERSION})"),
])
def test_on_the_host_a_python_without_the_pins_is_refused(visible_tmp_path, monkeypatch, versions, found):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    python = fake_python(visible_tmp_path, versions)
    result = check("--host", "--sglang-python", python)
    assert result.exit_code == 1
    # One error: the parsers of a Python without the pins are not run to repeat it, nor is its file counted
    # again by the host's tool check.
    (line,) = [line for line in result.output.splitlines() if line.startswith(("error: --sglang-python",
                                                                                "error: tools.sglang_python"))]
    assert line.startswith("error: --sglang-python") and found in line
    # The fake is no virtual environment (-S skips finding one): pip may not change it, a new one is made.
    assert "; fix: make an environment of its own: `python3 -m venv /opt/sglang-env && " in line
    assert all(requirement in line for requirement in pins.serving_requirements())
    assert "skipped: parser check skipped: --sglang-python is not an SGLang Python with the pins" in result.output


@pytest.mark.parametrize("host", [["--host"], ["--no-host"]], ids=["on the target", "elsewhere"])
def test_a_python_that_does_not_exist_or_cannot_run_is_one_error_with_the_command_that_makes_it(
        visible_tmp_path, monkeypatch, host):
    """Off the target too: a named Python is run for the parsers, so one that is not there is said so."""
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    missing = str(visible_tmp_path / "env" / "bin" / "python")
    result = check(*host, "--sglang-python", missing)
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")
               and ("sglang-python" in line or "tools.sglang" in line)]
    assert "the SGLang Python does not exist" in line
    assert f"`python3 -m venv {visible_tmp_path / 'env'} && {missing} -m pip install " in line
    not_executable = visible_tmp_path / "python"
    not_executable.write_text("#!/bin/sh\n")
    result = check(*host, "--sglang-python", str(not_executable))
    assert result.exit_code == 1 and "the SGLang Python cannot be run (not executable by this user)" in result.output


def test_off_the_target_a_python_without_the_pins_is_refused_and_a_missing_nixl_warns(visible_tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(LAPTOP, "systemd is not running here"))
    python = fake_python(visible_tmp_path, {"sglang": pins.SGLANG_VERSION, pins.ROUTER_DISTRIBUTION: "1.0.0"})
    data = json.loads(check("--json", "--sglang-python", python).stdout)
    assert data["valid"] is False and data["host_checks"]["on"] is False
    ((error, warning),) = [[(p["severity"], p["message"]) for p in data["problems"]]]
    assert error == ("error", f"has {pins.ROUTER_DISTRIBUTION} 1.0.0 (pinned: {pins.ROUTER_VERSION}): the units "
                              "would run this Python (pins: pdserve.schema.pins)")
    assert warning[0] == "warning" and f"has no {pins.NIXL_DISTRIBUTION}" in warning[1]
    # --no-parsers off the target runs nothing, so the Python is not asked: said so.
    quiet = json.loads(check("--json", "--no-parsers", "--sglang-python", python).stdout)
    assert quiet["valid"] is True and "--sglang-python: not asked for its packages (--no-parsers, and no host " \
        "checks)" in quiet["skipped"]


def test_on_the_host_parsers_that_cannot_be_imported_are_an_error_not_a_skip(visible_tmp_path, monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))
    # The pinned versions are installed (dist-info) but nothing can be imported: a broken environment.
    python = fake_python(visible_tmp_path, PINNED)
    on = check("--host", "--json", "--sglang-python", python)
    messages = [p["message"] for p in json.loads(on.stdout)["problems"] if p["field"] == "--sglang-python"]
    assert any("cannot import the parser of prefill, decode, fallback" in m for m in messages), messages
    assert any("cannot import the parser of router" in m for m in messages), messages
    # Off the host (a laptop, the NixOS build's --no-host) the same Python is a stated skip.
    off = json.loads(check("--no-host", "--json", "--sglang-python", python).stdout)
    assert off["valid"] is True and any("parser not importable" in s for s in off["skipped"])


def test_the_nixos_build_check_command_line_still_works(tmp_path, visible_tmp_path, reference_data):
    # nixos-modules/pdserve.nix: `pdserve check --json --no-host --sglang-python <env>/bin/python A.json B.json`.
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(reference_data))
    reference_data.update(name="other")
    for section, port in (("prefill", 31000), ("decode", 31002), ("router", 31001)):
        reference_data[section]["port"] = port
    reference_data["router"].update(prometheus_port=29100, health_check_port=29101)
    reference_data.setdefault("transfer", {})["bootstrap_port"] = 8999
    b.write_text(json.dumps(reference_data))
    python = fake_python(visible_tmp_path, PINNED)
    result = check("--json", "--no-host", "--sglang-python", python, str(a), str(b))
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["valid"] is True, result.output
    assert [d["host_checks"]["on"] for d in data["deployments"]] == [False, False]


# -- the SGLang Python: given or found -------------------------------------------------------------

def deployment_file(tmp_path: Path, data) -> str:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_venv_named_in_the_file_gives_its_bin_python(tmp_path, visible_tmp_path, reference_data):
    python = fake_python(visible_tmp_path, {})
    reference_data["tools"] = {"sglang_venv": str(Path(python).parent.parent)}
    result = CliRunner().invoke(main, ["plan", "--json", "-c", deployment_file(tmp_path, reference_data),
                                       "--numactl", "/usr/bin/numactl", "--pdserve", "/x/pdserve"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["roles"]["decode"]["argv"][4] == python


def test_a_python_and_a_venv_at_once_are_refused(tmp_path, reference_data):
    reference_data["tools"] = {"sglang_python": "/opt/a/bin/python", "sglang_venv": "/opt/b"}
    result = check("--no-host", "--no-parsers", "-c", deployment_file(tmp_path, reference_data))
    assert result.exit_code == 1
    assert 'error: tools.sglang_venv = "/opt/b": is set beside tools.sglang_python (/opt/a/bin/python)' in result.output


def test_render_refuses_without_an_sglang_python_and_never_takes_python3_from_path(tmp_path, visible_tmp_path,
                                                                                  monkeypatch):
    bin_dir = visible_tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python", "numactl", "pdserve"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--out", str(out)])
    assert result.exit_code == 1 and not out.exists()
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: tools.sglang_python = (unset):") and "tools.sglang_venv" in line
    assert "--sglang-python" in line
    # numactl and pdserve still come from PATH.
    ok = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", "/opt/sg/bin/python",
                                   "--no-python-check"])
    assert ok.exit_code == 0, ok.output
    assert f"{bin_dir}/numactl" in (out / "sglang-dsv4-prefill.service").read_text()
