"""Unit state from `systemctl show` (pdserve.probes.systemctl.UnitState, the one the cutover reads too).

Whether a unit should start at boot follows the deployment's declared `boot_layout` (pdserve.schema.boot):
pd enables prefill, decode and router; single enables only the fallback. "Enabled" is systemd's own
meaning, defined once in pdserve.probes.systemctl.ENABLED_STATES for the verifier and the cutover alike.
"""

from __future__ import annotations

from pdserve.probes.systemctl import UnitState
from pdserve.schema.boot import Layout
from pdserve.verify.result import CheckResult, failed, passed, warned

# 1 = CLD_EXITED, 2 = CLD_KILLED, 3 = CLD_DUMPED (siginfo codes systemd reports in ExecMainCode).
EXIT_CODES = {1: "exited", 2: "killed by signal", 3: "dumped core (signal)"}


def _state(state: UnitState) -> str:
    return f"{state.active_state} ({state.sub_state}), {state.unit_file_state or 'no unit file state'}"


def _failed(state: UnitState) -> bool:
    return state.active_state == "failed" or state.result not in ("success", "")


def _failure_details(state: UnitState, journal: list[str]) -> list[str]:
    how = EXIT_CODES.get(state.exec_main_code, f"code {state.exec_main_code}")
    details = [f"Result={state.result}, ExecMainStatus={state.exec_main_status} ({how}), "
               f"NRestarts={state.n_restarts}"]
    details += [f"journal: {line}" for line in journal]
    return details


def _boot_fix(unit: str, layout: Layout, enable: bool) -> str:
    verb = "enable" if enable else "disable"
    return (f"boot_layout = \"{layout}\" declares that {unit} {'starts' if enable else 'does not start'} at boot: "
            f"`systemctl {verb} {unit}` (NixOS: the module's wantedBy follows settings.boot_layout; "
            "`nixos-rebuild switch`), or change boot_layout if the other layout is meant to boot")


def needs_journal(role: str, state: UnitState) -> bool:
    """Whether the check's report gets the unit's journal lines: a failed unit, or a PD unit not active."""
    return _failed(state) or (role != "fallback" and state.active_state != "active")


def check_pd_unit(check_id: str, unit: str, state: UnitState, journal: list[str],
                  boot_layout: Layout = "pd") -> CheckResult:
    """prefill, decode and router units: active, and enabled exactly when boot_layout is pd."""
    boots = boot_layout == "pd"
    expected = f"loaded, {'enabled' if boots else 'disabled (boot_layout = single)'}, active (running)"
    if not state.installed:
        return failed(check_id, f"{unit}: LoadState={state.load_state}", expected,
                      "install the units: `pdserve render --out /etc/systemd/system` (NixOS: enable "
                      "services.pdserve) and `systemctl daemon-reload`")
    if _failed(state):
        details = _failure_details(state, journal)
        return failed(check_id, f"{unit}: {_state(state)}; {details[0]}", expected,
                      f"read `journalctl -u {unit} -n 200`, fix the cause, then `systemctl restart {unit}`",
                      details)
    if state.active_state != "active":
        return failed(check_id, f"{unit}: {_state(state)}", expected,
                      f"`systemctl start {unit}` and follow `journalctl -fu {unit}`",
                      [f"journal: {line}" for line in journal])
    if state.enabled != boots:
        return warned(check_id, f"{unit}: {_state(state)}", expected, _boot_fix(unit, boot_layout, boots))
    return passed(check_id, f"{unit}: {_state(state)}", expected)


def check_fallback_unit(check_id: str, unit: str, state: UnitState, journal: list[str],
                        boot_layout: Layout = "pd") -> CheckResult:
    """The single-server fallback: installed and not active while PD serves; enabled exactly when
    boot_layout is single."""
    boots = boot_layout == "single"
    expected = f"{'enabled (boot_layout = single)' if boots else 'disabled'} and inactive (PD layout serving)"
    if state.load_state == "not-found":
        return warned(check_id, f"{unit}: not installed", expected,
                      "render and install the fallback unit so `pdserve cutover` has a layout to return to")
    if state.running:
        return failed(check_id, f"{unit}: {_state(state)}", expected,
                      f"the fallback holds the GPUs and port of the PD layout: `systemctl disable --now {unit}`, "
                      "then start the PD units (or run `pdserve cutover`)")
    if state.active_state == "failed":
        details = _failure_details(state, journal)
        return failed(check_id, f"{unit}: failed; {details[0]}", expected,
                      f"it failed when last started (see the journal lines); clear the state with "
                      f"`systemctl reset-failed {unit}` once understood", details)
    if state.enabled and not boots:
        return failed(check_id, f"{unit}: {_state(state)}", expected,
                      f"`systemctl disable {unit}`: enabled, it would fight the PD units for the GPUs at boot "
                      "(or declare boot_layout = \"single\" if the fallback is meant to boot)")
    if boots and not state.enabled:
        return warned(check_id, f"{unit}: {_state(state)}", expected, _boot_fix(unit, boot_layout, True))
    return passed(check_id, f"{unit}: {_state(state)}", expected)
