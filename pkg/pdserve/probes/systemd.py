"""systemd through `systemctl show` and `journalctl`, each call bounded by the probe timeout."""

from __future__ import annotations

import os
import shutil
import subprocess

from pdserve.probes.observations import Unavailable

SHOW_PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "UnitFileState", "Result",
    "ExecMainStatus", "ExecMainCode", "MainPID", "NRestarts", "ControlGroup",
)
def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B UNIT` output: one `Key=Value` per line."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props




def unavailable_reason() -> str | None:
    """Why systemd cannot be asked here, or None when it can (sd_booted(3)'s test plus the binaries)."""
    if not os.path.isdir("/run/systemd/system"):
        return "systemd is not running on this host (no /run/systemd/system)"
    if shutil.which("systemctl") is None:
        return "systemctl is not on PATH"
    return None


def _run(argv: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"`{' '.join(argv)}` did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise Unavailable(f"cannot run {argv[0]}: {exc.strerror}") from None
    if done.returncode != 0 and not done.stdout:
        raise Unavailable(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def show(unit: str, timeout: float) -> dict[str, str]:
    argv = ["systemctl", "show", f"{unit}.service", *[f"--property={p}" for p in SHOW_PROPERTIES]]
    return parse_show(_run(argv, timeout))


def journal(unit: str, lines: int, timeout: float) -> list[str]:
    if shutil.which("journalctl") is None:
        return []
    try:
        out = _run(["journalctl", "-u", f"{unit}.service", "-n", str(lines), "-o", "cat", "--no-pager"], timeout)
    except Unavailable as exc:
        return [f"(journal unavailable: {exc})"]
    return [line for line in out.splitlines() if line.strip()]


def grep_journal(unit: str, needle: str, timeout: float, lines: int = 20000) -> list[str]:
    """Lines of the unit's recent journal that contain `needle` (the KV capacity fallback). Filtered here
    rather than with `journalctl --grep`, which needs a journalctl built with PCRE2."""
    if shutil.which("journalctl") is None:
        return []
    try:
        out = _run(["journalctl", "-u", f"{unit}.service", "-n", str(lines), "-o", "cat", "--no-pager"], timeout)
    except Unavailable:
        return []
    return [line for line in out.splitlines() if needle in line]


def cgroup_pids(control_group: str) -> list[int]:
    """Every process in a unit's cgroup (cgroup v2 first, then the v1 systemd hierarchy)."""
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        path = os.path.join(root, control_group.lstrip("/"), "cgroup.procs")
        try:
            with open(path, encoding="ascii") as handle:
                return [int(line) for line in handle if line.strip()]
        except OSError:
            continue
    return []
