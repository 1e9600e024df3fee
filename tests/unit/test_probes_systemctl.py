"""One `systemctl show` parser and one UnitState for the verifier and the cutover, on output recorded from a
real systemd: systemd 252 (252.39-1~deb12u2) in the container tier's Debian bookworm container, 2026-12-01,
`systemctl show -p <PROPERTIES> -- pdserve-rec-sleep.service pdserve-rec-fail.service nothere.service
systemd-journald.service`, where the first two were started with `systemd-run` (`sleep 600`, `sh -c 'exit 3'`);
the output is tests/fixtures/recorded/systemd-252-show.txt, byte for byte."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pdserve.probes.systemctl import ENABLED_STATES, PROPERTIES, Systemctl, SystemctlError, UnitState, parse_show

RECORDED_SHOW = (Path(__file__).resolve().parents[1] / "fixtures/recorded/systemd-252-show.txt").read_text()
# `systemctl is-enabled systemd-journald.service getty@tty1.service pdserve-rec-sleep.service`, same container.
RECORDED_IS_ENABLED = {"systemd-journald.service": "static", "getty@tty1.service": "enabled",
                       "pdserve-rec-sleep.service": "transient"}


def test_parse_show_reads_every_block_by_id():
    states = parse_show(RECORDED_SHOW)
    assert list(states) == ["pdserve-rec-sleep.service", "pdserve-rec-fail.service", "nothere.service",
                            "systemd-journald.service"]
    sleep = states["pdserve-rec-sleep.service"]
    assert (sleep.active_state, sleep.sub_state, sleep.main_pid) == ("active", "running", 37)
    assert sleep.control_group == "/system.slice/pdserve-rec-sleep.service" and sleep.running and sleep.installed
    assert sleep.fragment_path == "/run/systemd/transient/pdserve-rec-sleep.service"
    assert sleep.active_enter_us == 11076748558 and sleep.exec_main_start_us == 11076748241


def test_a_failed_unit_keeps_how_its_main_process_ended():
    fail = parse_show(RECORDED_SHOW)["pdserve-rec-fail.service"]
    assert (fail.active_state, fail.result, fail.exec_main_code, fail.exec_main_status) == ("failed", "exit-code", 1, 3)
    assert not fail.running and fail.control_group == ""
    assert fail.describe() == "pdserve-rec-fail.service: failed/failed, result=exit-code, exit status 3"


def test_a_missing_unit_is_not_installed_and_not_enabled():
    missing = parse_show(RECORDED_SHOW)["nothere.service"]
    assert missing == UnitState("nothere.service")  # every property at its "never ran" value
    assert not missing.installed and not missing.enabled and not missing.running


def test_enabled_follows_systemds_is_enabled_states():
    """static and transient are what `systemctl is-enabled` printed for units that nothing links into a
    target: not enabled. Only enabled and enabled-runtime are (ENABLED_STATES)."""
    states = parse_show(RECORDED_SHOW)
    for name in ("pdserve-rec-sleep.service", "systemd-journald.service"):
        assert states[name].unit_file_state == RECORDED_IS_ENABLED[name] and not states[name].enabled
    getty = UnitState("getty@tty1.service", "loaded", unit_file_state=RECORDED_IS_ENABLED["getty@tty1.service"])
    assert getty.enabled
    assert ENABLED_STATES == {"enabled", "enabled-runtime"}
    for other in ("linked", "linked-runtime", "alias", "static", "indirect", "generated", "transient", "masked",
                  "masked-runtime", "disabled", "bad", "not-found", ""):
        assert not UnitState("u.service", unit_file_state=other).enabled, other


def test_show_asks_for_every_property_it_parses_and_each_unit_by_its_service_name():
    seen = []

    def runner(argv, timeout, **kwargs):
        seen.append((argv, timeout))
        return subprocess.CompletedProcess(argv, 0, RECORDED_SHOW, "")

    states = Systemctl(timeout=7, runner=runner).show(["pdserve-rec-sleep", "pdserve-rec-fail.service", "absent"])
    argv, timeout = seen[0]
    assert argv[:4] == ["systemctl", "show", "-p", ",".join(PROPERTIES)] and timeout == 7
    assert argv[-3:] == ["pdserve-rec-sleep.service", "pdserve-rec-fail.service", "absent.service"]
    assert states["pdserve-rec-sleep.service"].main_pid == 37
    assert states["absent.service"] == UnitState("absent.service")  # systemd printed no block for it
    for key in ("ControlGroup", "ExecMainCode", "UnitFileState", "FragmentPath"):
        assert key in PROPERTIES and f"\n{key}=" in RECORDED_SHOW


@pytest.mark.parametrize("command,detail", [
    (["/nonexistent/systemctl"], "/nonexistent/systemctl is not installed"),
    (["/proc/self/status"], "cannot run /proc/self/status"),  # a file that is no program
])
def test_a_systemctl_that_cannot_run_is_a_systemctl_error(command, detail):
    with pytest.raises(SystemctlError, match=detail):
        Systemctl(command).show(["x"])
