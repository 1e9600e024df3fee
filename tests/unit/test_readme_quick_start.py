"""A newcomer follows the README alone: the quick start's shell blocks, run as written, in order, in a directory
that holds nothing but the venv the README's Run command made, take a two-GPU host from nothing to rendered,
installed and enabled units.

What a CPU machine without root cannot do is named here, not hidden: the block that makes the SGLang Python
(pip, several GB of CUDA wheels) is not run, and the test venv's Python stands in for it (CI installs the same
pins into it; tests/unit/test_sglang_python.py holds that block to the pins); `sudo` runs its command as the
test's user; `apt-get`, `useradd` and `systemctl` are recording stand-ins; numactl is a stand-in on PATH (the
file binds no NUMA node, so no unit runs it); the two absolute paths a test may not write are swapped for
directories of its own; and `verify`, with nothing started, lists its checks (`--list`) instead of running them.
Every swap is asserted to be in the README as written, so a quick start that changes fails here first.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.render.reach import unreachable
from pdserve.render.toolchain import create_command
from tests.conftest import require_or_skip, require_the_pins_here

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SGLANG_PYTHON = "/opt/sglang-env/bin/python"
UNIT_DIR = "/etc/systemd/system"
VERIFY = ".venv/bin/pdserve verify -c my-host.toml"
# Commands that change the host: each records its argv, one line, into $RECORD.
RECORDED = ("apt-get", "useradd", "systemctl")


def quick_start() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Quick start")
    return text[start:text.index("\n## ", start + 1)]


def blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def _stand_ins(bin_dir: Path, record: Path) -> None:
    bin_dir.mkdir()
    scripts = {name: f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> {shlex.quote(str(record))}\n' for name in RECORDED}
    # sudo: this user runs the command (recorded too, so the test sees what needed root).
    scripts["sudo"] = f'#!/bin/sh\nprintf "%s\\n" "sudo $*" >> {shlex.quote(str(record))}\nexec "$@"\n'
    scripts["numactl"] = '#!/bin/sh\n# numactl [options] -- command: a stand-in that only runs the command\n' \
                         'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n[ "$#" -gt 0 ] && shift\n' \
                         'exec "$@"\n'
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


def test_the_readmes_two_commands_are_what_ci_runs():
    """The README opens with Run and Test; .ci/run installs with the same setup and ends with the same pytest,
    and Run's last word, the plan of the embedded reference, works without a file."""
    first = blocks(README.read_text(encoding="utf-8"), "sh")[0]
    run, test = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert test == "bash .ci/setup && .venv/bin/pytest"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    assert "bash .ci/setup" in ci and ci[-1] == ".venv/bin/pytest", ci[-3:]
    install, plan = run.rsplit(" && ", 1)
    assert install == "python3 -m venv .venv && .venv/bin/pip install -q -e ." and plan == ".venv/bin/pdserve plan"
    done = subprocess.run([str(Path(sys.executable).parent / "pdserve"), "plan"], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "pkg")})
    assert done.returncode == 0 and "sglang-dsv4-prefill" in done.stdout, done.stderr[-2000:]


def test_the_quick_start_has_the_steps_this_test_runs():
    section = quick_start()
    shell = blocks(section, "sh")
    assert len(shell) == 4, shell
    # Step 1 is the install path without Nix, exactly as `check` prints it as a fix.
    assert shell[0].strip() == create_command(SGLANG_PYTHON).replace(" && ", "\n")
    for swapped in (SGLANG_PYTHON, UNIT_DIR):
        assert swapped in "".join(shell[1:]), swapped
    assert [line for line in shell[3].splitlines() if line.startswith(".venv/bin/pdserve verify")] == [VERIFY]


def test_a_newcomer_gets_from_a_fresh_clone_to_enabled_units(visible_tmp_path):
    require_the_pins_here()
    python = sys.executable  # the test venv's Python: it has the pins (above), as /opt/sglang-env would
    if unreachable(python, ("prefill",), "execute"):
        pytest.skip(f"the test venv's Python {python} is where units cannot see it; check would refuse it")
    clone, units, record = visible_tmp_path / "pdserve", visible_tmp_path / "etc-systemd-system", \
        visible_tmp_path / "host-changes.log"
    clone.mkdir()
    units.mkdir()
    record.touch()
    # The state after the README's Run command: a clone with .venv (this tree's code, through PYTHONPATH).
    (clone / ".venv").symlink_to(Path(python).parent.parent)
    _stand_ins(visible_tmp_path / "bin", record)

    shell = blocks(quick_start(), "sh")[1:]  # not step 1: see the module's docstring
    script = "\n".join(shell).replace(SGLANG_PYTHON, python).replace(UNIT_DIR, str(units))
    script = script.replace(VERIFY + "\n", VERIFY + " --list\n")
    env = {"PATH": f"{visible_tmp_path / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": str(ROOT / "pkg"), "LANG": "C.UTF-8"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    # check: valid, through the real parsers and the pinned packages; not the target here, and said so.
    assert "my-host.toml: valid (0 error(s)" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "accepted by the real parser" in done.stdout + done.stderr
    # On a GPU host with systemd and these two GPUs, check would also check the host (and find no model there).
    assert "host checks: off" in done.stdout + done.stderr, "this machine looks like the quick start's target host"
    # render: the four units and the JSON their gates read, into what the README calls /etc/systemd/system.
    written = sorted(p.name for p in units.iterdir())
    assert written == ["pdserve-qwen.json", "sglang-qwen-decode.service", "sglang-qwen-prefill.service",
                       "sglang-qwen-router.service", "sglang-qwen.service"], written
    prefill = (units / "sglang-qwen-prefill.service").read_text()
    assert f"ExecStart={python} -m sglang.launch_server --model-path /var/lib/models/Qwen3-8B" in prefill
    assert f"{clone}/.venv/bin/pdserve wait-ready prefill --config {units}/pdserve-qwen.json" in prefill
    assert "--base-gpu-id 0" in prefill and "--base-gpu-id 1" in (units / "sglang-qwen-decode.service").read_text()

    # The host changes: numactl installed, the units' user made, and exactly the units render marked for boot
    # (the PD layout's: an [Install] section) enabled and started.
    changes = record.read_text().splitlines()
    assert "apt-get install -y numactl" in changes, changes
    (useradd,) = [line.split() for line in changes if line.startswith("useradd ")]
    assert f"User={useradd[-1]}" in prefill
    (enable,) = [line.split() for line in changes if line.startswith("systemctl enable --now ")]
    at_boot = sorted(p.stem for p in units.glob("*.service") if "\n[Install]\n" in p.read_text())
    assert sorted(enable[3:]) == at_boot == ["sglang-qwen-decode", "sglang-qwen-prefill", "sglang-qwen-router"]
    assert changes.index("systemctl daemon-reload") < changes.index(" ".join(enable))
    # verify reads the same file: its check list names this deployment's roles.
    assert "e2e." in done.stdout and "units.prefill" in done.stdout, done.stdout[-2000:]


def test_the_nixos_alternative_parses(tmp_path):
    found = subprocess.run(["sh", "-c", "command -v nix-instantiate"], capture_output=True, text=True,
                           check=False).stdout.strip()
    require_or_skip(bool(found), "nix-instantiate is not installed (Debian: apt-get install nix-bin)",
                    "PDSERVE_REQUIRE_NIX")
    (nix,) = blocks(quick_start(), "nix")
    done = subprocess.run([found, "--parse", "-E", nix], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # The names it uses are the flake's and the module's.
    flake = (ROOT / "flake.nix").read_text()
    module = (ROOT / "nixos-modules" / "pdserve.nix").read_text()
    assert "nixosModules.default =" in flake and "overlays.default =" in flake
    assert 'enable = lib.mkEnableOption "pdserve' in module and "deployments = mkOption" in module
