"""systemd through systemctl: one unit state for every caller (verify, cutover), and the bounded calls.

Unit state is parsed from `systemctl show -p ...` (the way pytest-testinfra reads services), never
from `systemctl status`, whose text is for people. Every call has a timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# UnitFileState (`systemctl is-enabled`) values that mean "pulled in at boot": systemctl(1) says these
# two are "enabled via .wants/, .requires/ or Alias= symlinks", persistently (/etc) or for this boot
# (/run). A NixOS unit whose wantedBy names the target reads "enabled" too: its .wants/ link sits in
# /etc/systemd/system, only that directory lives in the store (the NixOS-shaped container tier sees
# "enabled" for the wanted PD units and "linked" for the fallback that nothing wants). Left out on
# purpose, with systemd's reasons:
# - linked, linked-runtime: the unit file is only made reachable by a symlink (a NixOS unit that nothing
#   wants); is-enabled exits non-zero for them. cutover used to count them as enabled.
# - alias: the queried name is an alias; it says nothing about whether the unit it names starts.
# - static, indirect: no [Install] rules (static) or only Also= (indirect): nothing links the unit in.
# - generated, transient: made by a generator or through the runtime API; "may not be enabled", their
#   maker decides. pdserve never generates its units, so for its units these mean "not ours to enable".
# - masked, masked-runtime, disabled, bad, not-found: not started.
# `systemctl is-enabled` also exits 0 for static, indirect, generated and transient: its exit status
# answers "is there anything to enable", not "does it start at boot", which is the question here.
ENABLED_STATES = frozenset({"enabled", "enabled-runtime"})


def is_enabled(unit_file_state: str) -> bool:
    """True when systemd says the unit starts at boot (see ENABLED_STATES for why only these two)."""
    return unit_file_state in ENABLED_STATES


PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "UnitFileState",
    "FragmentPath",
    "ControlGroup",
    "MainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "NRestarts",
    "InactiveExitTimestampMonotonic",
    "ActiveEnterTimestampMonotonic",
    "ExecMainStartTimestampMonotonic",
    "InvocationID",
)


def service(name: str) -> str:
    return name if "." in name else f"{name}.service"


@dataclass(frozen=True)
class UnitState:
    """One unit as `systemctl show` reports it. Timestamps are CLOCK_MONOTONIC microseconds (0: never)."""

    name: str
    load_state: str = "not-found"
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    unit_file_state: str = ""
    fragment_path: str = ""  # the unit file systemd loaded (on NixOS a link into the store)
    control_group: str = ""  # its cgroup below the hierarchy's root ("" when it runs nothing)
    main_pid: int = 0
    exec_main_code: int = 0  # how the main process ended: a CLD_* code (1 exited, 2 killed, 3 dumped)
    exec_main_status: int = 0
    n_restarts: int = 0
    inactive_exit_us: int = 0
    active_enter_us: int = 0
    exec_main_start_us: int = 0
    # The unit's current (or last) activation; journald tags every line the unit's processes write with
    # it (_SYSTEMD_INVOCATION_ID), so one start's log can be read apart from earlier ones. "": none yet.
    invocation_id: str = ""

    @property
    def installed(self) -> bool:
        return self.load_state == "loaded"

    @property
    def enabled(self) -> bool:
        """Starts at boot, in systemd's own terms (pdserve.probes.systemctl.ENABLED_STATES says which and why)."""
        return is_enabled(self.unit_file_state)

    @property
    def running(self) -> bool:
        """Up or on its way up (a unit in a restart loop counts: it holds, or will hold, its GPUs)."""
        return self.active_state in {"active", "activating", "reloading"}

    @property
    def restarting(self) -> bool:
        return self.sub_state == "auto-restart"

    def describe(self) -> str:
        text = f"{self.name}: {self.active_state}/{self.sub_state}"
        if self.result != "success":
            text += f", result={self.result}"
        if self.exec_main_status:
            text += f", exit status {self.exec_main_status}"
        if self.n_restarts:
            text += f", {self.n_restarts} restart(s)"
        return text


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def parse_show(text: str) -> dict[str, UnitState]:
    """Parse the output of `systemctl show -p Id,... UNIT...`: one block of KEY=VALUE per unit,
    blocks separated by an empty line, properties in systemd's own order (not the order asked).
    A value may itself hold `=` (Description=a=b): only the first one separates."""
    states: dict[str, UnitState] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" not in props:
            continue
        state = UnitState(
            name=props["Id"],
            load_state=props.get("LoadState", "not-found"),
            active_state=props.get("ActiveState", "inactive"),
            sub_state=props.get("SubState", "dead"),
            result=props.get("Result", "success"),
            unit_file_state=props.get("UnitFileState", ""),
            fragment_path=props.get("FragmentPath", ""),
            control_group=props.get("ControlGroup", ""),
            main_pid=_int(props.get("MainPID")),
            exec_main_code=_int(props.get("ExecMainCode")),
            exec_main_status=_int(props.get("ExecMainStatus")),
            n_restarts=_int(props.get("NRestarts")),
            inactive_exit_us=_int(props.get("InactiveExitTimestampMonotonic")),
            active_enter_us=_int(props.get("ActiveEnterTimestampMonotonic")),
            exec_main_start_us=_int(props.get("ExecMainStartTimestampMonotonic")),
            invocation_id=props.get("InvocationID", ""),
        )
        states[state.name] = state
    return states


def unavailable_reason() -> str | None:
    """Why systemd cannot be asked here, or None when it can (sd_booted(3)'s test plus the binary)."""
    if not os.path.isdir("/run/systemd/system"):
        return "systemd is not running on this host (no /run/systemd/system)"
    if shutil.which("systemctl") is None:
        return "systemctl is not on PATH"
    return None


class SystemctlError(RuntimeError):
    def __init__(self, argv: Sequence[str], detail: str):
        self.argv = list(argv)
        self.detail = " / ".join(line.strip() for line in detail.splitlines() if line.strip())
        verb = next((a for a in argv[1:] if not a.startswith("-")), "")
        super().__init__(f"{argv[0]} {verb} failed: {self.detail}")

    @property
    def read_only(self) -> bool:
        """systemctl could not write a link: the unit directory is on a read-only file system (EROFS)."""
        return "read-only file system" in self.detail.lower()


Runner = Callable[..., subprocess.CompletedProcess[str]]


class Systemctl:
    """Thin, bounded wrapper around the systemctl binary (or any command prefix that ends in one)."""

    def __init__(self, command: Sequence[str] = ("systemctl",), timeout: float = 60.0,
                 runner: Runner = subprocess.run):
        self.command = list(command)
        self.timeout = timeout
        self._run = runner

    def _call(self, *args: str, timeout: float | None = None) -> str:
        argv = [*self.command, *args]
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=timeout or self.timeout, check=False)
        except FileNotFoundError:
            raise SystemctlError(argv, f"{self.command[0]} is not installed") from None
        except OSError as exc:  # not executable, not a program
            raise SystemctlError(argv, f"cannot run {self.command[0]}: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise SystemctlError(argv, f"no answer within {timeout or self.timeout:g} s") from None
        if done.returncode != 0:
            raise SystemctlError(argv, (done.stderr or done.stdout).strip() or f"exit status {done.returncode}")
        return done.stdout

    def show(self, units: Sequence[str]) -> dict[str, UnitState]:
        names = [service(u) for u in units]
        states = parse_show(self._call("show", "-p", ",".join(PROPERTIES), "--", *names))
        return {name: states.get(name, UnitState(name)) for name in names}

    def start(self, units: Sequence[str]) -> None:
        """Queue start jobs and return at once; the caller polls `show` with its own deadline."""
        self._call("start", "--no-block", "--", *map(service, units))

    def stop(self, units: Sequence[str], timeout: float) -> None:
        """Stop and wait for the units to be down (bounded by `timeout`)."""
        self._call("stop", "--", *map(service, units), timeout=timeout)

    def add_wants(self, target: str, units: Sequence[str]) -> None:
        """Link the units into `target`.wants/, as `enable` does for WantedBy=target, but also for a
        unit without [Install] (the renderer gives one only to the units of the declared boot layout)."""
        self._call("add-wants", "--", target, *map(service, units))

    def disable(self, units: Sequence[str]) -> None:
        self._call("disable", "--", *map(service, units))

    def reset_failed(self, units: Sequence[str]) -> None:
        # Fails for units that are not failed on some systemd versions; the result is the same.
        with contextlib.suppress(SystemctlError):
            self._call("reset-failed", "--", *map(service, units))
