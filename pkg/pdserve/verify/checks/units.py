"""Unit state from `systemctl show` (the way pytest-testinfra reads it)."""

from __future__ import annotations

from pdserve.verify.result import CheckResult, failed, passed, warned

SHOW_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "UnitFileState", "Result",
    "ExecMainStatus", "ExecMainCode", "MainPID", "NRestarts", "ControlGroup",
)
ENABLED = {"enabled", "enabled-runtime"}
# 1 = CLD_EXITED, 2 = CLD_KILLED, 3 = CLD_DUMPED (siginfo codes systemd reports in ExecMainCode).
EXIT_CODES = {"1": "exited", "2": "killed by signal", "3": "dumped core (signal)"}


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B UNIT` output: one `Key=Value` per line."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def _state(props: dict[str, str]) -> str:
    return (f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')}), "
            f"{props.get('UnitFileState') or 'no unit file state'}")


def _failure_details(props: dict[str, str], journal: list[str]) -> list[str]:
    how = EXIT_CODES.get(props.get("ExecMainCode", ""), f"code {props.get('ExecMainCode', '?')}")
    details = [f"Result={props.get('Result', '?')}, ExecMainStatus={props.get('ExecMainStatus', '?')} ({how}), "
               f"NRestarts={props.get('NRestarts', '?')}"]
    details += [f"journal: {line}" for line in journal]
    return details


def check_pd_unit(check_id: str, unit: str, props: dict[str, str], journal: list[str]) -> CheckResult:
    """prefill, decode and router units: enabled and active."""
    expected = "loaded, enabled, active (running)"
    if props.get("LoadState") != "loaded":
        return failed(check_id, f"{unit}: LoadState={props.get('LoadState', '?')}", expected,
                      f"install the units: `pdserve render --out /etc/systemd/system` (NixOS: enable "
                      f"services.pdserve) and `systemctl daemon-reload`")
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
    if enabled not in ENABLED:
        return warned(check_id, f"{unit}: {_state(props)}", expected,
                      f"`systemctl enable {unit}` so it starts at boot (NixOS: wantedBy)")
    return passed(check_id, f"{unit}: {_state(props)}", expected)


def check_fallback_unit(check_id: str, unit: str, props: dict[str, str], journal: list[str]) -> CheckResult:
    """The single-server fallback: installed, disabled and not active while PD serves."""
    expected = "disabled and inactive (PD layout serving)"
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
    if enabled in ENABLED:
        return failed(check_id, f"{unit}: {_state(props)}", expected,
                      f"`systemctl disable {unit}`: enabled, it would fight the PD units for the GPUs at boot")
    return passed(check_id, f"{unit}: {_state(props)}", expected)
