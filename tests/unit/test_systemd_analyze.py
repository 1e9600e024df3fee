"""`systemd-analyze verify` on the rendered units, in a root that holds the tools as stub executables.

systemd-analyze only warns about unknown keys and bad values and still exits 0, so any line on
stderr fails the test.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pdserve.render.units import render_units
from pdserve.schema.loading import deployment_from_data
from tests.conftest import require_or_skip

HOST_UNITS = Path("/usr/lib/systemd/system")


def make_root(tmp_path: Path, units, tools) -> Path:
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    for path in (tools.sglang_python, tools.numactl, tools.pdserve, tools.keyed_launcher):
        stub = root / path.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for unit in units:
        (root / "etc/systemd/system" / unit.filename).write_text(unit.text)
    return root


def analyze(root: Path, units) -> subprocess.CompletedProcess:
    paths = [str(root / "etc/systemd/system" / u.filename) for u in units]
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", *paths],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def analyzer():
    require_or_skip(shutil.which("systemd-analyze") is not None and HOST_UNITS.is_dir(),
                    "systemd-analyze or /usr/lib/systemd/system is missing", "PDSERVE_REQUIRE_SYSTEMD")


@pytest.mark.parametrize("api_key", [None, "/etc/pdserve/router.key"])
def test_rendered_units_verify_cleanly(analyzer, reference_data, tools, tmp_path, api_key):
    reference_data["router"]["api_key_file"] = api_key
    dep = deployment_from_data(reference_data, "t").deployment
    units = render_units(dep, tools, "/etc/pdserve/dsv4.json")
    done = analyze(make_root(tmp_path, units, tools), units)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_the_check_catches_a_bad_unit(analyzer, reference, tools, tmp_path):
    """The harness must be able to fail: an unknown key only warns, and that warning fails us."""
    units = render_units(reference, tools, "/etc/pdserve/dsv4.json")
    root = make_root(tmp_path, units, tools)
    bad = root / "etc/systemd/system" / units[0].filename
    bad.write_text(bad.read_text().replace("[Service]\n", "[Service]\nRestartt=always\n"))
    done = analyze(root, units)
    assert "Unknown key 'Restartt'" in done.stderr
