"""Unit state from `systemctl show` (the way pytest-testinfra reads it).

Whether a unit should start at boot follows the deployment's declared `boot_layout` (pdserve.schema.boot):
pd enables prefill, decode and router; single enables only the fallback. "Enabled" is systemd's own
meaning, defined once in pdserve.probes.systemctl.ENABLED_STATES for the verifier and the cutover alike.
"""

from __future__ import annotations

from pdserve.probes.systemctl import is_enabled
from pdserve.schema.boot import Layout
from pdserve.verify.result import CheckResult, failed, passed, warned

# 1 = CLD_EXITED, 2 = CLD_KILLED, 3 = CLD_DUMPED (siginfo codes systemd reports in ExecMainCode).
EXIT_CODES = {"1": "exited", "2": "killed by signal", "3": "dumped core (signal)"}


def _state(props: dict[str, str]) -> str:
    return (f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')}), "
            f"{props.get('UnitFileState') or 'no unit file state'}")


def _failure_details(props: dict[str, str], journal: list[str]) -> list[str]:
    how = EXIT_CODES.get(props.get("ExecMainCode", ""), f"code {props.get('ExecMainCode', '?')}")
    details = [f"Result={props.get('Result', '?')}, ExecMainStatus={props.get('ExecMainStatus', '?')} ({how}), "
               f"NRestarts={props.get('NRestarts', '?')}"]
    details += [f"journal: {line}" for line in journal]
    return details


def _boot_fix(unit: str, layout: Layout, enable: bool) -> str:
    verb = "enable" if enable else "disable"
    return (f"boot_layout = \"{layout}\" declares that {unit} {'starts' if enable else 'does not start'} at boot: "
            f"`systemctl {verb} {unit}` (NixOS: the module's wantedBy follows settings.boot_layout; "
            "`nixos-rebuild switch`), or change boot_layout if the other layout is meant to boot")


def check_pd_unit(check_id: str, unit: str, props: dict[str, str], journal: list[str],
                  boot_layout: Layout = "pd") -> CheckResult:
    """prefill, decode and router units: active, and enabled exactly when boot_layout is pd."""
    boots = boot_layout == "pd"
    expected = f"loaded, {'enabled' if boots else 'disabled (boot_layout = single)'}, active (running)"
    if props.get("LoadState") != "loaded":
        return failed(check_id, f"{unit}: LoadState={props.get('LoadState', '?')}", expected,
                      "install the units: `pdserve render --out /etc/systemd/system` (NixOS: enable "
                      "services.pdserve) and `systemctl daemon-reload`")
    active, enabled = props.get("ActiveState"), props.get("UnitFileState", "")
    if active == "failed" or props.get("Result", "success") not in ("success", ""):
        details = _failure_details(props, journal)
        return failed(check_id, f"{unit}: {_state(props)}; {details[0]}", expected,
                      f"read `journalctl -u {unit} -n 200`, fix the cause, then `systemctl restart {unit}`",
                      details)
    if active != "active":
        return failed(check_id, f"{unit}: {_state(props)}", expected,
                      f"`systemctl start {unit}` and follow `journalctl -fu {unit}`",
                      [f"journal: {line}" for line in journal])
    if is_enabled(enabled) != boots:
        return warned(check_id, f"{unit}: {_state(props)}", expected, _boot_fix(unit, boot_layout, boots))
    return passed(check_id, f"{unit}: {_state(props)}", expected)


def check_fallback_unit(check_id: str, unit: str, props: dict[str, str], journal: list[str],
                        boot_layout: Layout = "pd") -> CheckResult:
    """The single-server fallback: installed and not active while PD serves; enabled exactly when
    boot_layout is single."""
    boots = boot_layout == "single"
    expected = f"{'enabled (boot_layout = single)' if boots else 'disabled'} and inactive (PD layout serving)"
    load = props.get("LoadState")
    if load == "not-found":
        return warned(check_id, f"{unit}: not installed", expected,
                      "render and install the fallback unit so `pdserve cutover` has a layout to return to")
    active, enabled = props.get("ActiveState"), props.get("UnitFileState", "")
    if active in ("active", "activating", "reloading"):
        return failed(check_id, f"{unit}: {_state(props)}", expected,
                      f"the fallback holds the GPUs and port of the PD layout: `systemctl disable --now {unit}`, "
                      "then start the PD units (or run `pdserve cutover`)")
    if active == "failed":
        details = _failure_details(props, journal)
        return failed(check_id, f"{unit}: failed; {details[0]}", expected,
                      f"it failed when last started (see the journal lines); clear the state with "
                      f"`systemctl reset-failed {unit}` once understood", details)
    if is_enabled(enabled) and not boots:
        return failed(check_id, f"{unit}: {_state(props)}", expected,
                      f"`systemctl disable {unit}`: enabled, it would fight the PD units for the GPUs at boot "
                      "(or declare boot_layout = \"single\" if the fallback is meant to boot)")
    if boots and not is_enabled(enabled):
        return warned(check_id, f"{unit}: {_state(props)}", expected, _boot_fix(unit, boot_layout, True))
    return passed(check_id, f"{unit}: {_state(props)}", expected)
