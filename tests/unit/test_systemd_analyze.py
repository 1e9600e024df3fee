"""`systemd-analyze verify` and `systemd-analyze security --offline=yes` on the rendered units, in a root
that holds the tools as stub executables.

systemd-analyze only warns about unknown keys and bad values and still exits 0, so any line on
stderr fails the test. The security scores (render.hardening's sandbox) are asserted against issue
15's ceilings and printed as a table in pytest's terminal summary, so CI's log has them.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdserve.render.hardening import sandbox
from pdserve.render.units import render_units
from pdserve.schema.derived import unit_name
from pdserve.schema.loading import deployment_from_data
from tests.conftest import require_or_skip

HOST_UNITS = Path("/usr/lib/systemd/system")
# Issue 15's ceilings for `systemd-analyze security --offline=yes` (0 is best, 10 fully exposed).
CEILINGS = {"prefill": 4.0, "decode": 4.0, "fallback": 4.0, "router": 2.5}
OVERALL = re.compile(r"Overall exposure level for (\S+): (\d+\.\d+) (\S+)")


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


# --- security scores --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Score:
    variant: str
    unit: str
    role: str
    exposure: float
    verdict: str


SCORES: list[Score] = []


class _ScoreTable:
    """Prints every measured score in pytest's terminal summary (shown without -s, as CI runs pytest)."""

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not SCORES:
            return
        version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout.splitlines()[:1]
        terminalreporter.section("systemd-analyze security --offline=yes of the rendered units")
        terminalreporter.write_line(f"{' '.join(version)}; ceilings: workers {CEILINGS['prefill']}, "
                                    f"router {CEILINGS['router']} (0 best, 10 fully exposed)")
        terminalreporter.write_line(f"{'variant':<26} {'unit':<30} {'score':>5}  verdict")
        for row in SCORES:
            terminalreporter.write_line(f"{row.variant:<26} {row.unit:<30} {row.exposure:>5.1f}  {row.verdict}")


def shared_gpu_keyed_router(data: dict[str, Any]) -> dict[str, Any]:
    """Prefill and decode on one GPU set (allow_shared_gpus), a public router with an API key: the
    variant whose units differ most from the reference (After= ordering, keyed launcher, LoadCredential=)."""
    data = copy.deepcopy(data)
    data["allow_shared_gpus"] = True
    data["decode"]["gpus"], data["decode"]["numa_node"] = list(data["prefill"]["gpus"]), data["prefill"]["numa_node"]
    data["prefill"]["mem_fraction_static"] = data["decode"]["mem_fraction_static"] = 0.45
    data["router"]["host"], data["router"]["api_key_file"] = "0.0.0.0", "/etc/pdserve/router.key"
    return data


VARIANTS = {"reference": lambda data: data, "shared-gpu, keyed router": shared_gpu_keyed_router}


def security(root: Path, unit) -> tuple[float, str]:
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={root}", unit.filename],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    found = OVERALL.search(done.stdout)
    assert found and found[1] == unit.filename, done.stdout[-2000:]
    return float(found[2]), found[3]


@pytest.fixture
def score_table(request):
    if not any(isinstance(p, _ScoreTable) for p in request.config.pluginmanager.get_plugins()):
        request.config.pluginmanager.register(_ScoreTable(), "pdserve-security-table")


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_units_score_within_the_ceilings(analyzer, score_table, reference_data, tools, tmp_path, variant):
    dep = deployment_from_data(VARIANTS[variant](reference_data), "t").deployment
    units = render_units(dep, tools, "/etc/pdserve/dsv4.json")
    root = make_root(tmp_path, units, tools)
    done = analyze(root, units)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    roles = {unit_name(dep, role): role for role in CEILINGS}
    assert sorted(roles) == sorted(u.name for u in units)
    over = []
    for unit in units:
        exposure, verdict = security(root, unit)
        SCORES.append(Score(variant, unit.name, roles[unit.name], exposure, verdict))
        if exposure > CEILINGS[roles[unit.name]]:
            over.append(f"{unit.filename}: {exposure} > {CEILINGS[roles[unit.name]]}")
    assert not over, over


def test_the_score_check_can_fail(analyzer, score_table, reference, tools, tmp_path):
    """The same measurement on a unit without the sandbox scores far above every ceiling."""
    unit = next(u for u in render_units(reference, tools, "/etc/pdserve/dsv4.json") if u.name.endswith("-router"))
    keys = {key for key, _ in sandbox("router")}
    bare = "\n".join(line for line in unit.text.splitlines() if line.split("=", 1)[0] not in keys) + "\n"
    root = make_root(tmp_path, [], tools)
    (root / "etc/systemd/system" / unit.filename).write_text(bare)
    exposure, verdict = security(root, unit)
    SCORES.append(Score("sandbox removed", unit.name, "router", exposure, verdict))
    assert exposure > max(CEILINGS.values()) and verdict in {"EXPOSED", "UNSAFE"}, (exposure, verdict)
