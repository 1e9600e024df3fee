"""Several deployments on one host: every listener and every unit name is checked against the others,
by the rules and through `pdserve check A B` (what the NixOS module runs at build time)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.rules_across import listeners, validate_across

# A second deployment beside the reference: every port and the name moved off the reference's.
SECOND = {"name": "other", "prefill": {"port": 31000}, "decode": {"port": 31002},
          "router": {"port": 31001, "prometheus_port": 29100, "health_check_port": 29101},
          "transfer": {"bootstrap_port": 8999}}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


def deployment(data: dict[str, Any]):
    return deployment_from_data(data, "<test>").deployment


@pytest.fixture
def second(reference_data) -> dict[str, Any]:
    return merged(reference_data, SECOND)


def test_two_deployments_on_distinct_ports_and_names_pass(reference_data, second):
    assert validate_across([deployment(reference_data), deployment(second)]) == []


@pytest.mark.parametrize("field", ["prefill.port", "decode.port", "router.port", "router.prometheus_port",
                                   "router.health_check_port", "transfer.bootstrap_port"])
def test_each_listener_collides_with_the_same_listener_of_another(reference_data, second, field):
    section, key = field.split(".")
    second[section][key] = (reference_data.get(section, {}).get(key)
                            or deployment(reference_data).model_dump()[section][key])
    problems = validate_across([deployment(reference_data), deployment(second)])
    assert [(p.field, p.value) for p in problems] == [(f"other: {field}", second[section][key])]
    assert f"deployment dsv4's {field}" in problems[0].message


def test_a_listener_collides_with_a_different_listener_of_another(reference_data, second):
    second["router"]["prometheus_port"] = 8998  # the reference's bootstrap port
    (problem,) = validate_across([deployment(reference_data), deployment(second)])
    assert problem.field == "other: router.prometheus_port"
    assert "deployment dsv4's transfer.bootstrap_port" in problem.message


def test_a_fallback_on_its_own_port_collides_but_on_its_routers_port_does_not(reference_data, second):
    assert [listener.field for listener in listeners(deployment(second))] == [
        "prefill.port", "decode.port", "router.port", "router.prometheus_port", "transfer.bootstrap_port",
        "router.health_check_port"]
    second["fallback"]["port"] = 30002  # the reference's decode port
    (problem,) = validate_across([deployment(reference_data), deployment(second)])
    assert (problem.field, problem.value) == ("other: fallback.port", 30002)


def test_the_same_name_collides_once(reference_data, second):
    second["name"] = "dsv4"
    (problem,) = validate_across([deployment(reference_data), deployment(second)])
    assert problem.field == "dsv4: name" and "sglang-dsv4-prefill.service" in problem.message


def test_a_name_that_is_another_units_name_collides(reference_data, second):
    # Deployment "dsv4-prefill" has the fallback unit sglang-dsv4-prefill: the reference's prefill unit.
    second["name"] = "dsv4-prefill"
    (problem,) = validate_across([deployment(reference_data), deployment(second)])
    assert (problem.field, problem.value) == ("dsv4-prefill: name", "dsv4-prefill")
    assert "sglang-dsv4-prefill.service, which deployment dsv4 already has" in problem.message


def check(*args: str):
    return CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", *args])


def write(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_check_of_several_files_checks_them_together(tmp_path, reference_data, second):
    a, b = write(tmp_path, "a.json", reference_data), write(tmp_path, "b.json", second)
    result = check(a, b)
    assert result.exit_code == 0, result.output
    assert "2 deployments together: valid" in result.output

    second["transfer"]["bootstrap_port"] = 8998
    result = check(a, write(tmp_path, "b.json", second))
    assert result.exit_code == 1
    assert ("error: other: transfer.bootstrap_port = 8998: is already taken by deployment dsv4's "
            "transfer.bootstrap_port") in result.output


def test_check_json_of_several_files_lists_each_and_the_collisions(tmp_path, reference_data):
    a = write(tmp_path, "a.json", reference_data)
    result = check("--json", a, a)
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["valid"] is False and [d["valid"] for d in data["deployments"]] == [True, True]
    assert {p["field"] for p in data["across"]} >= {"dsv4: name", "dsv4: router.port"}


def test_check_of_one_file_is_unchanged(tmp_path, reference_data):
    result = check("--json", "-c", write(tmp_path, "a.json", reference_data))
    assert result.exit_code == 0 and "deployments" not in json.loads(result.stdout)


def test_a_file_that_does_not_load_fails_with_its_own_problems(tmp_path, reference_data, second):
    del second["model"]
    result = check(write(tmp_path, "a.json", reference_data), write(tmp_path, "b.json", second))
    assert result.exit_code == 1 and "model" in result.output
