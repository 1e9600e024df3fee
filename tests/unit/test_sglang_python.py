"""The SGLang Python a deployment runs (pdserve.check.sglang_python), asked for real: a virtual environment made
here with the pinned distributions written as dist-info, a Python that is not there, one that cannot run; the
fix commands it prints run in the shell as shown; `render` refuses what `check` refuses; and the README's
install command is the pins'."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.check.sglang_python import package_problems
from pdserve.cli.main import main
from pdserve.render.toolchain import create_command, install_command
from pdserve.schema import pins
from pdserve.schema.problems import Severity

README = Path(__file__).resolve().parents[2] / "README.md"


def venv_with(root: Path, versions: dict[str, str]) -> str:
    """A real virtual environment (no pip in it) whose site-packages holds `versions` as dist-info only."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = root.glob("lib/python*/site-packages")
    for name, version in versions.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(root / "bin" / "python")


def test_a_venv_lacking_the_router_is_one_error_whose_fix_installs_into_it(visible_tmp_path, reference):
    python = venv_with(visible_tmp_path / "env", {"sglang": pins.SGLANG_VERSION})
    (error, warning) = package_problems(reference, python, "--sglang-python", nixl_severity=Severity.WARNING)
    assert error.severity is Severity.ERROR and warning.severity is Severity.WARNING
    assert error.message.startswith(f"has no {pins.ROUTER_DISTRIBUTION} (pinned: {pins.ROUTER_VERSION})")
    assert error.fix.startswith(f"`{install_command(python)}`, or point --sglang-python")
    assert f"no {pins.NIXL_DISTRIBUTION}" in warning.message
    # With the pins written in, nothing is wrong; a deployment without NIXL does not ask for it.
    full = venv_with(visible_tmp_path / "full", {"sglang": pins.SGLANG_VERSION,
                                                  pins.ROUTER_DISTRIBUTION: pins.ROUTER_VERSION,
                                                  pins.NIXL_DISTRIBUTION: pins.NIXL_VERSION})
    assert package_problems(reference, full, "--sglang-python") == []
    mooncake = reference.model_copy(update={"transfer": reference.transfer.model_copy(update={"backend": "mooncake"})})
    (only,) = package_problems(mooncake, python, "--sglang-python")
    assert pins.NIXL_DISTRIBUTION not in only.message + only.fix


def test_the_fix_commands_quote_any_path_for_the_shell(tmp_path):
    python = "/opt/my env/$(touch MARK)/bin/python"
    words = shlex.split(install_command(python))
    assert words == [python, "-m", "pip", "install", *pins.serving_requirements()]
    made = create_command(python, nixl=False)
    first, second = made.split(" && ")
    assert shlex.split(first) == ["python3", "-m", "venv", "/opt/my env/$(touch MARK)"]
    assert shlex.split(second)[0] == python and pins.NIXL_DISTRIBUTION not in made
    assert create_command("/usr/bin/python3").startswith("python3 -m venv /opt/sglang-env && ")


@pytest.mark.parametrize("kind", ["missing", "not executable", "no python"])
def test_render_refuses_a_python_it_cannot_use_and_writes_nothing(visible_tmp_path, tmp_path, kind):
    path = visible_tmp_path / "python"
    if kind == "not executable":
        path.write_text("#!/bin/sh\n")
    elif kind == "no python":
        path.write_text("#!/bin/sh\necho 'not python' >&2\nexit 3\n")
        path.chmod(0o755)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", str(path),
                                       "--numactl", "/usr/bin/numactl", "--pdserve", "/usr/bin/pdserve"])
    assert result.exit_code == 1 and not out.exists(), result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    expected = {"missing": "the SGLang Python does not exist",
                "not executable": "the SGLang Python cannot be run (not executable by this user)",
                "no python": "the SGLang Python failed when asked its package versions: not python"}[kind]
    assert line.startswith(f'error: --sglang-python = "{path}": {expected}; fix: '), line
    if kind == "missing":  # no venv's bin/python: one is made where the fix says, and named there
        assert "`python3 -m venv /opt/sglang-env && /opt/sglang-env/bin/python -m pip install " in line
        assert "`, and point --sglang-python at /opt/sglang-env/bin/python; or point" in line
    # Told to write units for another machine, render does not ask.
    elsewhere = CliRunner().invoke(main, ["render", "--out", str(out), "--sglang-python", str(path),
                                          "--numactl", "/usr/bin/numactl", "--pdserve", "/usr/bin/pdserve",
                                          "--no-python-check"])
    assert elsewhere.exit_code == 0, elsewhere.output


def test_the_readmes_install_command_is_the_pins():
    """The quick start's command, and every copy of it in docs/, installs exactly the pins."""
    def commands(page: Path) -> list[str]:
        return re.findall(r"^/opt/sglang-env/bin/python -m pip install .*$", page.read_text(), re.MULTILINE)

    assert len(commands(README)) == 1
    for page in [README, *sorted((README.parent / "docs").glob("*.md"))]:
        assert set(commands(page)) <= {install_command("/opt/sglang-env/bin/python")}, page


def test_no_sglang_python_named_is_told_how_to_make_one(tmp_path, reference_data):
    """check's fix for a missing SGLang Python names the install path without Nix, NIXL included where the
    deployment moves KV with it, and without it where it does not."""
    from pdserve.render.toolchain import missing_tools
    from pdserve.schema.loading import deployment_from_data

    for backend, nixl in (("nixl", True), ("mooncake", False)):
        reference_data["transfer"] = {**reference_data.get("transfer", {}), "backend": backend}
        dep = deployment_from_data(json.loads(json.dumps(reference_data)), "t").deployment
        (problem,) = missing_tools(dep, {}, "sglang_python")
        made = create_command("/opt/sglang-env/bin/python", nixl)
        assert problem.fix.endswith(f"without Nix, make one first: `{made}`")
        assert (pins.NIXL_DISTRIBUTION in problem.fix) is nixl
