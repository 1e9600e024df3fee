"""pid -> unit from /proc/PID/cgroup, on lines recorded from a real systemd and on this machine's /proc.

RECORDED_* were read on 2026-12-01 inside the systemd 252 container of the container tier (Debian
bookworm under systemd-nspawn on this CI host, whose cgroups are v1 with a v2 hierarchy beside them, so
each line set has both the `name=systemd` line and the `0::` line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdserve.probes.cgroups import cgroup_pids, systemd_cgroup_path, unit_of, unit_of_cgroup_path

V1_CONTROLLERS = "8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n4:memory:/\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n"
# `systemd-run --unit=pdserve-rec-sleep sleep 600`: a transient service.
RECORDED_SERVICE = ("9:name=systemd:/system.slice/pdserve-rec-sleep.service\n" + V1_CONTROLLERS
                    + "0::/system.slice/pdserve-rec-sleep.service\n")
# `systemd-run --scope --unit=pdserve-rec-scope sleep 600`: a scope.
RECORDED_SCOPE = ("9:name=systemd:/system.slice/pdserve-rec-scope.scope\n" + V1_CONTROLLERS
                  + "0::/system.slice/pdserve-rec-scope.scope\n")
RECORDED_INIT = "9:name=systemd:/init.scope\n" + V1_CONTROLLERS + "0::/init.scope\n"
# A process entered into the container with nsenter: outside the container's cgroup namespace root.
RECORDED_OUTSIDE = "9:name=systemd:/..\n" + V1_CONTROLLERS + "0::/..\n"
# This CI host itself (no systemd): a sandbox's memory controller path, the rest at the root.
RECORDED_SANDBOX = ("9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n"
                    "4:memory:/process_api/636dd0dbfa45624d011b1ac3947cd21a\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n")


@pytest.mark.parametrize("text,unit", [
    (RECORDED_SERVICE, "pdserve-rec-sleep.service"),
    (RECORDED_SCOPE, "pdserve-rec-scope.scope"),
    (RECORDED_INIT, "init.scope"),
    (RECORDED_OUTSIDE, None),
    (RECORDED_SANDBOX, None),
    # cgroup v2 only (a current distribution): one line.
    ("0::/system.slice/sglang-dsv4-prefill.service\n", "sglang-dsv4-prefill.service"),
    # cgroup v1 only (no 0:: line): systemd's named hierarchy, not another controller's path.
    ("3:cpu,cpuacct:/docker/abc\n1:name=systemd:/system.slice/sglang-dsv4-decode.service\n",
     "sglang-dsv4-decode.service"),
    # A template instance and an escaped name keep their spelling.
    ("0::/system.slice/system-getty.slice/getty@tty1.service\n", "getty@tty1.service"),
    ("0::/system.slice/sglang-my\\x2dmodel.service\n", "sglang-my\\x2dmodel.service"),
    # A session, and an app scope under a user's manager: systemd names the system unit, user@1000.service.
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-jupyter.scope\n", "user@1000.service"),
    # A payload cgroup below a service (delegation) still belongs to the service.
    ("0::/system.slice/sglang-dsv4-prefill.service/payload\n", "sglang-dsv4-prefill.service"),
    # A container runtime's own tree is no systemd unit.
    ("0::/kubepods/burstable/pod1234/abcdef\n", None),
])
def test_unit_of_reads_systemds_hierarchy(tmp_path: Path, text: str, unit: str | None):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(text)
    assert unit_of(42, tmp_path) == unit
    assert unit_of(43, tmp_path) is None  # no such process


def test_the_v2_line_wins_over_a_v1_controller():
    assert systemd_cgroup_path("4:memory:/process_api/x\n0::/system.slice/a.service\n") == "/system.slice/a.service"
    assert systemd_cgroup_path(RECORDED_SANDBOX) == "/"
    assert unit_of_cgroup_path("/") is None and unit_of_cgroup_path("/system.slice") is None


def test_this_process_on_the_real_proc():
    """This machine's own /proc and /sys: the path read from /proc/self/cgroup is a cgroup that holds this
    very process, the unit is the one that path names (None where it names none), and a pid that does not
    exist is None."""
    path = systemd_cgroup_path(Path("/proc/self/cgroup").read_text())
    assert path is not None and path.startswith("/")
    assert os.getpid() in cgroup_pids(path)
    assert unit_of(os.getpid()) == unit_of_cgroup_path(path)
    assert unit_of(2**22 + 1) is None  # above pid_max's ceiling: never a process


def test_cgroup_pids_reads_a_units_procs(tmp_path: Path):
    group = tmp_path / "systemd" / "system.slice" / "a.service"
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text("37\n41\n")
    roots = (str(tmp_path / "unified"), str(tmp_path / "systemd"))
    assert cgroup_pids("/system.slice/a.service", roots) == [37, 41]
    assert cgroup_pids("/system.slice/b.service", roots) == []
