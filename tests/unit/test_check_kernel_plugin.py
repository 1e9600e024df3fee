"""`pdserve check --host` and attention_kernels = "pdserve": the SGLang Python must hold pdserve's plugin
as a distribution with the sglang.srt.plugins entry point (asked of real Pythons: wrappers whose only
distributions are dist-info directories written here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.check import run as check_run
from pdserve.check.parsers import KERNEL_PLUGIN
from pdserve.cli.main import main
from tests.conftest import PINNED
from tests.unit.test_cli_check_host import TARGET, reading


def python_with(tmp_path: Path, plugins: dict[str, str] | None) -> str:
    """In `tmp_path` (one the units could see: check refuses a Python under /tmp), a real Python with the
    pinned sglang, router (smg) and NIXL (dist-info only) and, unless None, a pdserve-kernels distribution whose
    entry_points.txt names `plugins` in group sglang.srt.plugins."""
    site = tmp_path / "site"
    dists = [(name.replace("-", "_"), name, version, None) for name, version in PINNED.items()]
    if plugins is not None:
        dists.append(("pdserve_kernels", "pdserve-kernels", "0.1.0", plugins))
    for folder, name, version, entry_points in dists:
        info = site / f"{folder}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if entry_points is not None:
            lines = [f"{k} = {v}" for k, v in entry_points.items()]
            (info / "entry_points.txt").write_text("[sglang.srt.plugins]\n" + "\n".join(lines) + "\n")
    wrapper = tmp_path / "venv" / "bin" / "python"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def checked(tmp_path, reference_data, python: str, kernels: str = "pdserve") -> dict:
    reference_data["decode"]["attention_kernels"] = kernels
    path = tmp_path / "d.json"
    path.write_text(json.dumps(reference_data))
    result = CliRunner().invoke(main, ["check", "--host", "--no-parsers", "--json", "-c", str(path),
                                       "--sglang-python", python])
    return json.loads(result.stdout) | {"exit_code": result.exit_code}


@pytest.fixture(autouse=True)
def on_the_target(monkeypatch):
    monkeypatch.setattr(check_run, "THIS_HOST", reading(TARGET))


def test_a_python_with_the_plugins_entry_point_passes(tmp_path, visible_tmp_path, reference_data):
    name, value = KERNEL_PLUGIN
    data = checked(tmp_path, reference_data, python_with(visible_tmp_path, {name: value}))
    assert not [p for p in data["problems"] if p["field"] == "decode.attention_kernels"], data["problems"]
    assert '--sglang-python has pdserve\'s SGLang plugin (attention_kernels = "pdserve")' in data["checked"]


@pytest.mark.parametrize(("plugins", "has"), [
    (None, "it has: none"),
    ({"pdserve_kernels": "somewhere.else:load"}, "it has: pdserve_kernels = somewhere.else:load"),
])
def test_a_python_without_the_plugin_is_refused_naming_the_field_and_the_fix(tmp_path, visible_tmp_path, reference_data,
                                                                             plugins, has):
    data = checked(tmp_path, reference_data, python_with(visible_tmp_path, plugins))
    (problem,) = [p for p in data["problems"] if p["field"] == "decode.attention_kernels"]
    assert data["exit_code"] == 1 and problem["severity"] == "error"
    assert ("no sglang.srt.plugins entry point pdserve_kernels = pdserve_kernels.sglang_plugin:load"
            in problem["message"])
    assert has in problem["message"] and "SGLang would run its own kernels" in problem["message"]
    assert "sglang-env" in problem["fix"] and 'decode.attention_kernels = "sglang"' in problem["fix"]


def test_not_asking_for_the_kernels_asks_nothing_of_the_python(tmp_path, visible_tmp_path, reference_data):
    # Asked, this Python (no plugin) would be refused: that nothing is said shows nothing was asked.
    data = checked(tmp_path, reference_data, python_with(visible_tmp_path, None), kernels="sglang")
    assert not [p for p in data["problems"] if "attention_kernels" in p["field"]], data["problems"]
    assert not any("SGLang plugin" in line for line in data["checked"])
