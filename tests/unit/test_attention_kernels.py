"""The attention_kernels switch (issue 16 item 4): the schema field, the reserved PDSERVE_DSA_KERNELS
environment key, and the unit's environment that carries it, as `pdserve plan` shows it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.argv import launches
from pdserve.render.units import render_units
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.placement import place
from pdserve.schema.problems import ConfigError
from tests.unit.test_units import CONFIG, parse_unit

SERVERS = ("prefill", "decode", "fallback")
UNITS = {"prefill": "sglang-dsv4-prefill", "decode": "sglang-dsv4-decode", "fallback": "sglang-dsv4"}


def problems_of(data) -> list:
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "test")
    return caught.value.problems


def unit_environment(dep, tools) -> dict[str, list[str]]:
    return {u.name: parse_unit(u.text)["Service"]["Environment"] for u in render_units(dep, tools, CONFIG)}


def test_every_server_defaults_to_sglangs_kernels(reference):
    kernels = {p.role: p.spec.attention_kernels for p in place(reference).placed if p.spec is not None}
    assert kernels == dict.fromkeys(SERVERS, "sglang")


def test_an_unknown_kernel_choice_names_the_field_and_the_choices(reference_data):
    reference_data["decode"]["attention_kernels"] = "flashmla"
    (problem,) = problems_of(reference_data)
    assert problem.field == "decode.attention_kernels" and problem.value == "flashmla"
    assert problem.fix == "use one of: sglang, pdserve"


@pytest.mark.parametrize(("path", "field"), [
    (("environment",), "environment"),
    (("decode", "env"), "decode.env"),
    (("fallback", "env"), "fallback.env"),
    (("router", "env"), "router.env"),
])
@pytest.mark.parametrize("value", ["pdserve", "sglang"])
def test_the_kernels_variable_is_reserved_wherever_environment_is_given(reference_data, path, field, value):
    section = reference_data
    for key in path:
        section = section.setdefault(key, {})
    section["PDSERVE_DSA_KERNELS"] = value
    (problem,) = problems_of(reference_data)
    assert problem.field == field
    assert "PDSERVE_DSA_KERNELS is rendered by pdserve" in problem.message
    assert 'set attention_kernels = "pdserve"' in problem.fix and "decode.attention_kernels" in problem.fix


def test_units_carry_an_explicit_off_by_default(reference, tools):
    env = unit_environment(reference, tools)
    for role in SERVERS:
        assert env[UNITS[role]].count('"PDSERVE_DSA_KERNELS=sglang"') == 1, role
    assert not any("PDSERVE_DSA_KERNELS" in line for line in env["sglang-dsv4-router"])


@pytest.mark.parametrize("role", SERVERS)
def test_a_server_that_asks_gets_pdserves_kernels_and_only_that_server(reference_data, tools, role):
    reference_data[role]["attention_kernels"] = "pdserve"
    dep = deployment_from_data(reference_data, "t").deployment
    env = unit_environment(dep, tools)
    for other in SERVERS:
        expected = "pdserve" if other == role else "sglang"
        assert f'"PDSERVE_DSA_KERNELS={expected}"' in env[UNITS[other]], other
    # The launch the renderer, plan and the GPU tier share has it too.
    assert launches(dep, tools)[role].env["PDSERVE_DSA_KERNELS"] == "pdserve"


def test_plan_shows_the_kernels_per_server(tmp_path, reference_data):
    reference_data["decode"]["attention_kernels"] = "pdserve"
    path = tmp_path / "d.json"
    path.write_text(json.dumps(reference_data))
    args = ["plan", "-c", str(path), "--sglang-python", "/opt/sg/bin/python", "--numactl", "/usr/bin/numactl",
            "--pdserve", "/opt/pd/bin/pdserve"]
    shown = CliRunner().invoke(main, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    roles = {role: item["env"] for role, item in json.loads(shown.output)["roles"].items()}
    assert roles["decode"]["PDSERVE_DSA_KERNELS"] == "pdserve"
    assert roles["prefill"]["PDSERVE_DSA_KERNELS"] == "sglang"
    assert "PDSERVE_DSA_KERNELS" not in roles["router"]
    text = CliRunner().invoke(main, args).output
    assert "PDSERVE_DSA_KERNELS=pdserve" in text and "PDSERVE_DSA_KERNELS=sglang" in text
