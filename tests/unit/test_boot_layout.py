"""boot_layout: the declared boot layout decides [Install] in the rendered units, and one definition of
"enabled" (systemd's) serves the cutover and the verifier."""

from __future__ import annotations

import pytest

from pdserve.probes.systemctl import ENABLED_STATES, UnitState, is_enabled
from pdserve.render.units import render_units
from pdserve.schema.boot import file_line, nixos_line
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError
from tests.unit.test_units import CONFIG, parse_unit

PD = ("sglang-dsv4-prefill", "sglang-dsv4-decode", "sglang-dsv4-router")


def rendered(reference_data, tools, **top):
    reference_data.update(top)
    dep = deployment_from_data(reference_data, "t").deployment
    return {u.name: parse_unit(u.text) for u in render_units(dep, tools, CONFIG)}


def test_default_is_pd_only_pd_units_are_wanted(reference_data, tools):
    units = rendered(reference_data, tools)
    assert all(units[n]["Install"] == {"WantedBy": ["multi-user.target"]} for n in PD)
    assert "Install" not in units["sglang-dsv4"]


def test_single_wants_only_the_fallback_at_the_configured_target(reference_data, tools):
    reference_data["systemd"]["wanted_by"] = "graphical.target"
    units = rendered(reference_data, tools, boot_layout="single")
    assert units["sglang-dsv4"]["Install"] == {"WantedBy": ["graphical.target"]}
    assert not any("Install" in units[n] for n in PD)
    # The rest of each unit does not depend on the boot layout.
    pd_units = rendered(reference_data, tools, boot_layout="pd")
    assert {n: {k: v for k, v in u.items() if k != "Install"} for n, u in units.items()} == \
        {n: {k: v for k, v in u.items() if k != "Install"} for n, u in pd_units.items()}


def test_an_unknown_boot_layout_names_the_field_and_the_choices(reference_data):
    reference_data["boot_layout"] = "both"
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(reference_data, "t")
    (problem,) = caught.value.problems
    assert problem.field == "boot_layout" and problem.value == "both"
    assert problem.line().endswith("fix: use one of: pd, single")


def test_enabled_means_what_systemd_says_starts_at_boot():
    assert ENABLED_STATES == {"enabled", "enabled-runtime"}
    # is-enabled exits 0 for some of these, but none of them links the unit into a boot target.
    for state in ("linked", "linked-runtime", "alias", "static", "indirect", "generated", "transient",
                  "masked", "disabled", "bad", ""):
        assert not is_enabled(state), state
        assert not UnitState("x.service", unit_file_state=state).enabled
    assert UnitState("x.service", unit_file_state="enabled-runtime").enabled


def test_the_lines_to_change_are_spelled_for_their_file(reference):
    assert nixos_line(reference, "single") == 'services.pdserve.deployments.dsv4.settings.boot_layout = "single";'
    assert file_line("single", "/etc/pdserve/dsv4.toml") == 'boot_layout = "single"'
    assert file_line("pd", "/etc/systemd/system/pdserve-dsv4.JSON") == '"boot_layout": "pd"'
