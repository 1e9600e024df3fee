"""units.* follow the declared boot layout: with boot_layout = "single" the fallback is expected
enabled and the PD units disabled; "enabled" is systemd's meaning (pdserve.probes.systemctl.ENABLED_STATES)."""

from __future__ import annotations

import subprocess

from pdserve.probes.systemctl import Systemctl, UnitState
from pdserve.verify.checks import units


def props(active: str, unit_file_state: str) -> UnitState:
    return UnitState("u.service", "loaded", active, "running" if active == "active" else "dead",
                     unit_file_state=unit_file_state)


def test_pd_units_follow_boot_layout():
    assert units.check_pd_unit("units.router", "r", props("active", "enabled"), [], "pd").status == "pass"
    assert units.check_pd_unit("units.router", "r", props("active", "disabled"), [], "single").status == "pass"
    wrong = units.check_pd_unit("units.router", "r", props("active", "enabled"), [], "single")
    assert wrong.status == "warn" and "systemctl disable r" in wrong.remediation and "boot_layout" in wrong.remediation
    missing = units.check_pd_unit("units.router", "r", props("active", "disabled"), [], "pd")
    assert missing.status == "warn" and "systemctl enable r" in missing.remediation


def test_fallback_follows_boot_layout():
    assert units.check_fallback_unit("units.fallback", "f", props("inactive", "enabled"), [], "single").status == "pass"
    assert units.check_fallback_unit("units.fallback", "f", props("inactive", "disabled"), [], "pd").status == "pass"
    unlinked = units.check_fallback_unit("units.fallback", "f", props("inactive", "static"), [], "single")
    assert unlinked.status == "warn" and "systemctl enable f" in unlinked.remediation
    # Enabled while PD is declared: it would fight the PD units for the GPUs at boot.
    assert units.check_fallback_unit("units.fallback", "f", props("inactive", "enabled"), [], "pd").status == "fail"
    # Running while PD is being verified is wrong in either boot layout.
    assert units.check_fallback_unit("units.fallback", "f", props("active", "enabled"), [], "single").status == "fail"


def test_linked_is_not_enabled():
    """A NixOS unit that nothing wants reads "linked" (the container tier sees it so): not enabled. The
    cutover used to count it as enabled while the verifier did not."""
    assert units.check_fallback_unit("units.fallback", "f", props("inactive", "linked"), [], "pd").status == "pass"
    result = units.check_pd_unit("units.prefill", "p", props("active", "linked"), [], "pd")
    assert result.status == "warn"


def test_the_runner_passes_the_declared_boot_layout(monkeypatch, reference):
    """units.* read boot_layout from the deployment being verified, not a fixed PD expectation."""
    import httpx

    from pdserve.verify import context, runner
    from pdserve.verify.expect import expectations
    from pdserve.verify.hosts import checks_for

    def systemctl_show(argv, **kwargs):
        # What `systemctl show -p ... UNIT` prints: the fallback enabled and stopped, the PD units running.
        unit = argv[-1]
        wanted = unit == f"sglang-{reference.name}.service"
        text = (f"Id={unit}\nLoadState=loaded\nActiveState={'inactive' if wanted else 'active'}\n"
                f"SubState={'dead' if wanted else 'running'}\nUnitFileState={'enabled' if wanted else 'disabled'}\n")
        return subprocess.CompletedProcess(argv, 0, text, "")

    monkeypatch.setattr(context, "unavailable_reason", lambda: None)
    single = reference.model_copy(update={"boot_layout": "single"})
    with httpx.Client() as client:
        for dep, status in ((single, "pass"), (reference, None)):
            ctx = runner.Context(dep, expectations(dep), runner.Options(), client, Systemctl(runner=systemctl_show))
            checks = checks_for(ctx.exp)
            results = {role: checks[f"units.{role}"](ctx).status for role in ("prefill", "fallback")}
            if status:
                assert results == {"prefill": "pass", "fallback": "pass"}
            else:  # declared pd: the same host is a disabled prefill (warn) and an enabled fallback (fail)
                assert results == {"prefill": "warn", "fallback": "fail"}
