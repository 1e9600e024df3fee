"""The cutover's boot step: boot links change only where this host lets them be written, the report
names the boot_layout line to change, and nothing about boot enablement rolls back a serving layout."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pdserve.cli.cutover import acts_locally, report_lines
from pdserve.cutover.boot_links import UnitFiles, boot_access, layout_at_boot
from pdserve.cutover.machine import Cutover
from pdserve.cutover.plan import plan_for
from pdserve.cutover.report import EXIT_SUCCESS, Outcome
from pdserve.probes.paths import PathFacts, path_facts
from pdserve.probes.systemctl import UnitState
from pdserve.schema.loading import deployment_from_data
from tests.unit.test_cutover import serving, step

SOURCE = "/etc/pdserve/t.toml"
STORE_UNITS = "/nix/store/0123abcd-pdserve-dsv4-units/lib/systemd/system"
NIXOS_DIR = UnitFiles(PathFacts("/etc/systemd/system", "/nix/store/4567efab-system-units", True))


@pytest.fixture
def dep(reference_data):
    reference_data["systemd"]["start_timeout_sec"] = 60
    return deployment_from_data(reference_data, "t").deployment


def declared(dep, layout):
    return dep.model_copy(update={"boot_layout": layout})


def run(dep, fake, target, source=SOURCE):
    return Cutover(plan_for(dep, target, source=source), fake).run()


def links(fake):
    return [(verb, units) for verb, units in fake.calls if verb in ("add-wants", "disable")]


def test_plain_host_links_the_target_first_then_unlinks_and_names_the_toml_line(dep):
    fake = serving(dep, "pd")
    report = run(dep, fake, "single")
    assert report.outcome is Outcome.SUCCESS
    # add-wants, not enable: the fallback of a pd boot layout has no [Install] for `enable` to read.
    assert links(fake) == [("add-wants", ("multi-user.target", fake.role["fallback"])), ("disable", tuple(fake.pd))]
    boot = report.boot
    assert (boot.result, boot.at_boot, boot.declared, boot.nixos) == ("changed", "single", "pd", False)
    assert boot.change == 'boot_layout = "single"' and SOURCE in boot.change_in and "pdserve render" in boot.change_in
    assert step(report, "enable at boot").result == "ok"
    assert "to keep it so" in step(report, "enable at boot").detail


def test_plain_host_with_the_target_declared_has_nothing_to_change_in_the_file(dep):
    fake = serving(dep, "pd")
    report = run(declared(dep, "single"), fake, "single", source="/etc/pdserve/t.json")
    assert report.boot.result == "changed" and report.boot.change is None and report.boot.at_boot == "single"


def test_a_json_deployment_gets_the_json_spelling(dep):
    fake = serving(dep, "single")
    report = run(declared(dep, "single"), fake, "pd", source="/etc/systemd/system/pdserve-dsv4.json")
    assert report.boot.change == '"boot_layout": "pd"'


def test_nixos_store_links_are_left_alone_and_the_option_line_is_named(dep):
    fake = serving(dep, "pd", NIXOS_DIR)
    report = run(dep, fake, "single")
    assert report.outcome is Outcome.SUCCESS and report.exit_code == EXIT_SUCCESS
    assert links(fake) == []
    assert fake.active() == {fake.role["fallback"]}
    boot = report.boot
    assert (boot.result, boot.at_boot, boot.nixos) == ("read-only", "pd", True)
    assert boot.change == 'services.pdserve.deployments.dsv4.settings.boot_layout = "single";'
    assert "nixos-rebuild switch" in boot.change_in
    boot_step = step(report, "enable at boot")
    assert boot_step.result == "skipped"
    assert "Nix store" in boot_step.detail and "to boot into single" in boot_step.detail
    as_json = json.loads(json.dumps(report.as_dict()))
    assert as_json["boot"]["change"] == boot.change and as_json["outcome"] == "success"
    text = "\n".join(report_lines(report))
    assert boot.change in text and "at boot: pd" in text


def test_nixos_seen_only_through_systemctl_fragment_paths(dep):
    """Driven through a wrapper (no filesystem facts): FragmentPath in the store is enough."""
    fake = serving(dep, "pd")
    for name in fake.units:
        fake._set(fake.units[name], fragment_path=f"{STORE_UNITS}/{name}")
    report = run(dep, fake, "single")
    assert links(fake) == [] and report.boot.nixos and report.boot.result == "read-only"
    assert "are unit files from the Nix store" in report.boot.detail


def test_a_read_only_unit_directory_elsewhere_names_the_file_line(dep):
    fake = serving(dep, "single", UnitFiles(PathFacts("/etc/systemd/system", "/etc/systemd/system", True)))
    report = run(declared(dep, "single"), fake, "pd")
    assert links(fake) == [] and report.exit_code == EXIT_SUCCESS
    assert report.boot.result == "read-only" and not report.boot.nixos
    assert "read-only file system" in report.boot.detail and report.boot.change == 'boot_layout = "pd"'


def test_a_unit_directory_this_user_may_not_write_says_so_not_read_only_file_system(dep):
    fake = serving(dep, "single", UnitFiles(PathFacts("/etc/systemd/system", "/etc/systemd/system", True, denied=True)))
    report = run(declared(dep, "single"), fake, "pd")
    assert links(fake) == [] and report.exit_code == EXIT_SUCCESS
    assert "/etc/systemd/system is not writable by this user (run as root" in report.boot.detail
    assert "read-only file system" not in report.boot.detail


def test_filesystem_facts_tell_a_read_only_mount_from_a_permission(tmp_path: Path, monkeypatch):
    import os

    from pdserve.probes import paths

    mine = path_facts(str(tmp_path))
    assert mine is not None and (mine.read_only, mine.denied) == (False, False)
    monkeypatch.setattr(paths.os, "access", lambda path, mode: False)
    denied = path_facts(str(tmp_path))
    assert denied is not None and (denied.read_only, denied.denied) == (True, True)
    real_statvfs = os.statvfs

    class ReadOnlyMount:
        def __init__(self, where):
            self.f_flag = real_statvfs(where).f_flag | os.ST_RDONLY

    monkeypatch.setattr(paths.os, "statvfs", ReadOnlyMount)
    mounted = path_facts(str(tmp_path))
    assert mounted is not None and (mounted.read_only, mounted.denied) == (True, False)
    reason = boot_access({}, UnitFiles(mounted)).reason
    assert reason == f"{tmp_path} is on a read-only file system"


def test_read_only_found_only_when_systemctl_tries_is_still_a_success(dep):
    fake = serving(dep, "single")
    fake.read_only_calls.add("add-wants")
    report = run(dep, fake, "pd")
    assert report.outcome is Outcome.SUCCESS and fake.active() == set(fake.pd)
    assert report.boot.result == "read-only" and "Read-only file system" in report.boot.detail
    assert "disable" not in fake.verbs(), "nothing unlinked once linking failed"
    assert step(report, "enable at boot").result == "skipped"
    assert report.boot.at_boot == "single"


def test_generated_units_are_not_enabled_by_hand(dep):
    fake = serving(dep, "pd")
    fake._set(fake.units[fake.role["fallback"]], unit_file_state="generated")
    report = run(dep, fake, "single")
    assert links(fake) == [] and "generator" in report.boot.detail and report.exit_code == EXIT_SUCCESS


def test_unlinking_that_fails_half_way_is_reported_not_rolled_back(dep):
    fake = serving(dep, "pd")
    fake.fail_calls.add("disable")
    report = run(dep, fake, "single")
    assert report.outcome is Outcome.SUCCESS and fake.active() == {fake.role["fallback"]}
    assert report.boot.result == "failed" and step(report, "enable at boot").result == "failed"
    # Both layouts are linked in now; the report says so rather than guessing.
    assert report.boot.at_boot == "pd+single"


def test_already_serving_with_read_only_links_is_unchanged_not_refused(dep):
    fake = serving(dep, "single", NIXOS_DIR)
    report = run(dep, fake, "single")
    assert report.outcome is Outcome.UNCHANGED and report.exit_code == EXIT_SUCCESS
    assert report.boot.result == "read-only" and report.boot.change is not None


def test_declared_target_that_does_not_boot_says_the_rebuild_is_missing(dep):
    fake = serving(dep, "pd", NIXOS_DIR)
    report = run(declared(dep, "single"), fake, "single")
    assert report.boot.change is None
    assert "`nixos-rebuild switch` has not run since" in report.boot.detail


def test_boot_access_rules():
    ok = {"a.service": UnitState("a.service", "loaded", unit_file_state="disabled",
                                 fragment_path="/etc/systemd/system/a.service")}
    plain = UnitFiles(PathFacts("/etc/systemd/system", "/etc/systemd/system", False),
                      {"a.service": PathFacts("/etc/systemd/system/a.service", "/etc/systemd/system/a.service", False)})
    assert boot_access(ok, plain).settable
    # Unit files in a read-only directory (an image's /usr) do not stop links in a writable /etc.
    usr = UnitFiles(plain.config_dir, {"a.service": PathFacts("/usr/lib/systemd/system/a.service",
                                                              "/usr/lib/systemd/system/a.service", True)})
    assert boot_access(ok, usr).settable
    masked = {"a.service": replace(ok["a.service"], unit_file_state="masked")}
    assert not boot_access(masked, plain).settable and "unmask" in boot_access(masked, plain).reason
    assert boot_access(ok, UnitFiles()).settable  # nothing known: systemctl's own answer decides


def test_layout_at_boot_reads_enablement():
    units = {"pd": ("p", "d", "r"), "single": ("f",)}
    st = {n: UnitState(n, unit_file_state="enabled" if n in "pdr" else "linked") for n in "pdrf"}
    assert layout_at_boot(st, units) == "pd"
    st["r"] = replace(st["r"], unit_file_state="disabled")
    assert layout_at_boot(st, units) == "none (partly: p, d)"


def test_filesystem_facts_follow_links(tmp_path: Path):
    real = tmp_path / "store" / "system-units"
    real.mkdir(parents=True)
    (tmp_path / "etc").symlink_to(real)
    facts = path_facts(str(tmp_path / "etc"))
    assert facts is not None and facts.resolved == str(real)
    assert path_facts(str(tmp_path / "absent")) is None


def test_only_a_plain_systemctl_lets_the_cutover_read_the_unit_files():
    assert acts_locally(["systemctl"]) and acts_locally(["/usr/bin/systemctl", "--no-pager"])
    assert not acts_locally(["nsenter", "-t", "1", "-a", "systemctl"])
    assert not acts_locally(["systemctl", "--root=/mnt"]) and not acts_locally(["systemctl", "-M", "box"])
