"""`cutover --dry-run`: what it lists, and what it says when it cannot read the host.

A dry run that could read the units says what runs and what it would stop (exit 0). One that could not
(no systemd, systemctl failing) says "state unknown" where it would otherwise have guessed "nothing
running", keeps `previous` null in its JSON, and exits Exit.UNKNOWN (4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.exits import Exit
from pdserve.cli.main import main
from pdserve.cutover import report
from pdserve.cutover.machine import Cutover
from pdserve.cutover.plan import plan_for
from pdserve.cutover.report import Outcome
from pdserve.probes.systemctl import PROPERTIES, SystemctlError, unavailable_reason
from tests.unit.test_cutover import FakeSystemd

# What systemctl 252 prints on a host not booted with systemd (this CI machine, 2026-12-01), exit 1.
NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")
NUMERIC = {"MainPID", "ExecMainCode", "ExecMainStatus", "NRestarts"}
UNITS = ("sglang-dsv4-prefill.service", "sglang-dsv4-decode.service", "sglang-dsv4-router.service",
         "sglang-dsv4.service")


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "systemctl"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def no_systemd(tmp_path: Path) -> str:
    """The host's own systemctl where systemd does not run here (as on this CI machine), else its recorded
    answer from such a host."""
    real = shutil.which("systemctl")
    if real and unavailable_reason() is not None:
        return real
    return script(tmp_path, f"cat >&2 <<'EOF'\n{NO_SYSTEMD}EOF\nexit 1\n")


def answering(tmp_path: Path, active: set[str]) -> str:
    """A systemctl whose `show` answers as systemd 252 does: every asked property, one block per unit."""
    blocks = []
    for unit in UNITS:
        up = unit in active
        props = {"Id": unit, "LoadState": "loaded", "ActiveState": "active" if up else "inactive",
                 "SubState": "running" if up else "dead", "UnitFileState": "enabled" if up else "disabled"}
        blocks.append("\n".join(f"{p}={props.get(p, '0' if p in NUMERIC or p.endswith('Monotonic') else '')}"
                                for p in PROPERTIES))
    answer = "\n\n".join(blocks) + "\n"
    return script(tmp_path, f'[ "$1" = show ] || exit 1\ncat <<\'EOF\'\n{answer}EOF\n')


def dry_run(systemctl: str, *extra: str):
    return CliRunner().invoke(main, ["cutover", "pd", "--dry-run", "--systemctl", systemctl, *extra])


@pytest.mark.parametrize("how", ["systemd not running", "systemctl not installed"])
def test_a_dry_run_that_cannot_read_the_units_says_state_unknown_and_exits_4(tmp_path: Path, how):
    systemctl = no_systemd(tmp_path) if how == "systemd not running" else str(tmp_path / "absent" / "systemctl")
    text = dry_run(systemctl)
    assert text.exit_code == Exit.UNKNOWN == 4, text.output
    lines = text.output.splitlines()
    assert lines[0] == "cutover of dsv4: state unknown -> pd"
    assert "nothing running" not in text.output and "held by nothing" not in text.output
    stop = next(line for line in lines if "stop current layout" in line)
    assert "state unknown" in stop and "sglang-dsv4.service" in stop
    assert "start what ran before (state unknown)" in text.output
    why = "Host is down" if how == "systemd not running" else "is not installed"
    assert lines[-1].startswith("state unknown (exit 4): which units run could not be read") and why in lines[-1]

    as_json = dry_run(systemctl, "--json")
    assert as_json.exit_code == 4
    data = json.loads(as_json.output)
    assert data["previous"] is None and data["previously_running"] == []
    assert why in data["state_unknown"]
    assert data["outcome"] == "dry-run-state-unknown" and data["exit_code"] == 4


def test_a_dry_run_that_reads_the_units_lists_what_it_would_stop_and_exits_0(tmp_path: Path):
    systemctl = answering(tmp_path, {"sglang-dsv4.service"})
    text = dry_run(systemctl)
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[0] == "cutover of dsv4: single -> pd"
    assert "3. stop current layout: sglang-dsv4.service" in text.output
    assert "start sglang-dsv4.service; smoke test" in text.output and "state unknown" not in text.output
    data = json.loads(dry_run(systemctl, "--json").output)
    assert (data["previous"], data["state_unknown"], data["outcome"], data["exit_code"]) == \
        ("single", None, "dry-run", 0)
    assert data["previously_running"] == ["sglang-dsv4.service"]
    # Nothing running is an observation too, and says so.
    idle = dry_run(answering(tmp_path, set()))
    assert idle.exit_code == 0 and "stop current layout: nothing running" in idle.output


def test_the_machine_reports_state_unknown_without_touching_anything(reference):
    fake = FakeSystemd(reference)

    def cannot(units):
        raise SystemctlError(["systemctl", "show"], "Failed to connect to bus: Host is down")

    fake.show = cannot
    result = Cutover(plan_for(reference, "single"), fake).dry_run()
    assert result.outcome is Outcome.DRY_RUN_UNKNOWN and result.exit_code == 4
    assert result.previous is None and result.previous_label == "state unknown"
    assert "Host is down" in result.state_unknown and fake.calls == []
    assert all(step.result == "planned" for step in result.steps)


def test_the_cutovers_exit_codes_are_the_command_lines():
    """The cutover cannot import pdserve.cli (a layer above it); its numbers must be the table's."""
    assert (report.EXIT_SUCCESS, report.EXIT_FAILED, report.EXIT_ROLLBACK_FAILED, report.EXIT_UNKNOWN) == (
        Exit.OK, Exit.PROBLEMS, Exit.INTERNAL, Exit.UNKNOWN)
