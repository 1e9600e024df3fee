"""`pdserve cutover` on a NixOS-shaped systemd: the unit files and /etc/systemd/system's links come from a
read-only store built once before boot (nixos_shape.py), so no cutover can change what boots.

It must still cut over both ways (exit 0, the new layout serving, never rolled back for the boot links
it cannot write), name the NixOS line that declares the new boot layout, and after a reboot the
declared layout (PD) must come back, whatever ran before. Real systemd 252, the real router (smg),
stand-in SGLang workers, as in test_units_in_systemd.py.

The tests run in file order on one container of their own; the last one reboots it.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdserve.schema.loading import deployment_from_data
from tests.integration.systemd import nixos_shape
from tests.integration.systemd.conftest import REPO, _prerequisites
from tests.integration.systemd.container import booted, fresh_container, wait_for
from tests.integration.systemd.lab import START_TIMEOUT_SEC, Lab
from tests.integration.systemd.test_units_in_systemd import print_timeline

pytestmark = pytest.mark.integration

NIXOS_LINE = 'services.pdserve.deployments.pdt.settings.boot_layout = "{}";'


@dataclass
class NixosLab:
    lab: Lab
    build: nixos_shape.StoreBuild

    @property
    def pd(self) -> set[str]:
        return {self.lab.unit(r) for r in ("prefill", "decode", "router")}

    @property
    def fallback(self) -> str:
        return self.lab.unit("fallback")

    def cutover(self, target: str, capsys, title: str) -> tuple[int, dict]:
        done = self.lab.pdserve("cutover", target, "-c", self.build.config, "--json")
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"no JSON report: {done.stdout}\n{done.stderr}\n{self.lab.diagnostics()}") from None
        print_timeline(capsys, title, report)
        with capsys.disabled():
            print(f"  boot: {report['boot']}")
        return done.returncode, report

    def cut_over_cleanly(self, target: str, previous: str, capsys) -> dict:
        """A cutover that must succeed from `previous` without any rollback step; its report."""
        code, report = self.cutover(target, capsys, f"NixOS-shaped cutover {target}")
        assert code == 0 and report["outcome"] == "success" and report["previous"] == previous, self.lab.diagnostics()
        assert no_rollback(report)
        return report


@pytest.fixture(scope="module")
def nixos(tmp_path_factory):
    _prerequisites()
    work = tmp_path_factory.mktemp("nixos-shaped")
    store = work / "store"
    box = fresh_container(work, REPO, read_only_binds=(f"{store}:{nixos_shape.STORE}",))
    lab = Lab.create(box, work)
    data = lab.variant()  # boot_layout left at its default: pd
    build = nixos_shape.build(box.root, store, data, box.env, work)
    lab.dep, lab.data = deployment_from_data(copy.deepcopy(data), "lab").deployment, data
    with booted(box, store):
        yield NixosLab(lab, build)


def no_rollback(report: dict) -> bool:
    return not any(s["name"].startswith("rollback") for s in report["steps"])


def test_the_store_decides_the_boot_links_and_pd_boots_as_declared(nixos, capsys):
    lab, box = nixos.lab, nixos.lab.container
    assert box.run(["readlink", "/etc/systemd/system"]).stdout.strip() == nixos.build.system_units
    assert nixos.build.wanted == {"multi-user.target": tuple(sorted(nixos.pd))}, "the fallback is not wanted"
    touched = box.run(["touch", "/etc/systemd/system/multi-user.target.wants/x.service"], check=False)
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr
    # What `systemctl enable` meets here, and what the cutover used to answer by rolling back.
    linked = box.run(["systemctl", "add-wants", "multi-user.target", nixos.fallback], check=False)
    assert linked.returncode != 0 and "Read-only file system" in linked.stderr, linked.stderr

    wait_for(lambda: lab.active() >= nixos.pd, START_TIMEOUT_SEC + 60, "the PD units the store wants to be active")
    states = lab.states()
    with capsys.disabled():
        print("\n" + "\n".join(f"  {n}: UnitFileState={s.unit_file_state} FragmentPath={s.fragment_path}"
                               for n, s in states.items()))
    assert all(states[u].enabled for u in nixos.pd)
    assert not states[nixos.fallback].enabled and not states[nixos.fallback].running
    assert lab.wait_serving().status_code == 200


def test_cutover_single_serves_and_names_the_nixos_line_instead_of_rolling_back(nixos, capsys):
    lab = nixos.lab
    report = nixos.cut_over_cleanly("single", "pd", capsys)
    boot_step = next(s for s in report["steps"] if s["name"] == "enable at boot")
    assert boot_step["result"] == "skipped" and "Nix store" in boot_step["detail"]
    boot = report["boot"]
    assert boot["result"] == "read-only" and boot["nixos"] and boot["declared"] == "pd"
    assert boot["change"] == NIXOS_LINE.format("single") and "nixos-rebuild switch" in boot["change_in"]
    # The store's links are as built: PD still starts at boot, which the report says.
    assert boot["at_boot"] == "pd"
    states = lab.states()
    assert all(states[u].enabled for u in nixos.pd) and not states[nixos.fallback].enabled
    assert lab.running() == {nixos.fallback}
    assert lab.wait_serving().status_code == 200


def test_cutover_pd_again_needs_no_change_to_the_configuration(nixos, capsys):
    lab = nixos.lab
    report = nixos.cut_over_cleanly("pd", "single", capsys)
    boot = report["boot"]
    assert boot["result"] == "read-only" and boot["change"] is None and boot["at_boot"] == "pd"
    assert lab.running() == nixos.pd
    assert lab.wait_serving().status_code == 200


def test_after_a_reboot_the_declared_layout_serves_whatever_ran_before(nixos, capsys):
    lab, box = nixos.lab, nixos.lab.container
    nixos.cut_over_cleanly("single", "pd", capsys)
    assert lab.running() == {nixos.fallback}
    # systemd's monotonic timestamps are the host's CLOCK_MONOTONIC: a container does not have its own.
    rebooted_at_us = time.monotonic_ns() // 1000
    boots = box.boots
    box.reboot()
    assert box.boots == boots + 1
    wait_for(lambda: lab.active() >= nixos.pd, START_TIMEOUT_SEC + 60, "the declared PD layout after the reboot")
    states = lab.states()
    assert all(states[u].active_enter_us > rebooted_at_us for u in nixos.pd), "not started by the new boot"
    assert not states[nixos.fallback].running
    assert lab.wait_serving().status_code == 200

    # The verifier reads the same store links: PD enabled and active, the fallback neither.
    verified = lab.pdserve("verify", "-c", nixos.build.config, "--json", timeout=300)
    results = json.loads(verified.stdout)
    units = {c["id"]: c for c in results["checks"] if c["id"].startswith("units.")}
    with capsys.disabled():
        print("=== pdserve verify after the reboot (units)")
        for check in units.values():
            print(f"  {check['status']:<5} {check['id']}: {check['observed']}")
    assert {c["status"] for c in units.values()} == {"pass"}, units
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-2000:]


def test_store_build_reads_the_rendered_install_sections(tmp_path: Path):
    """The "build" links what [Install] asks for, nothing else (checked without root)."""
    text = "[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target a.target\n"
    assert nixos_shape.install_targets(text) == ["multi-user.target", "a.target"]
    assert nixos_shape.install_targets(text.split("[Install]")[0]) == []
