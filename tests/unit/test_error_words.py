"""Errors in pdserve's own words (issue 42): no phrase of pydantic's reaches a user, a misspelled key or value
gets "did you mean", one cause is one error, and a file that stops the check says how far it got."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from pdserve.cli.main import main
from pdserve.schema.config import Deployment
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError, Problem

# Wrong values of every JSON type: each field refuses some of them with one of pydantic's own error types.
WRONG = [{"t": 1}, [["x"]], "text", -1, 0, 1.5, True, None, 10**30, ""]


def leaves(data: Any, loc: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(data, dict):
        return [loc] * bool(loc) + [leaf for key, value in data.items() for leaf in leaves(value, (*loc, key))]
    return [loc]


def put(data: dict[str, Any], loc: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    node = changed
    for part in loc[:-1]:
        node = node[part]
    node[loc[-1]] = value
    return changed


def problems_of(data: dict[str, Any]) -> list[Problem]:
    try:
        loaded = deployment_from_data(copy.deepcopy(data), "t")
    except ConfigError as exc:
        return exc.problems
    return loaded.warnings


def pydantic_phrases(data: dict[str, Any]) -> set[str]:
    """What pydantic itself says of `data`, but for the errors pdserve's own validators word."""
    try:
        Deployment.model_validate(copy.deepcopy(data))
    except ValidationError as exc:
        return {e["msg"] for e in exc.errors(include_url=False) if "fix" not in (e.get("ctx") or {})}
    return set()


def test_no_phrase_of_pydantics_reaches_a_user_for_any_wrong_value_of_any_field(reference_data):
    seen = 0
    for loc in leaves(reference_data):
        for value in WRONG:
            data = put(reference_data, loc, value)
            phrases = pydantic_phrases(data)
            seen += len(phrases)
            for problem in problems_of(data):
                said = f"{problem.message} {problem.fix}"
                assert not [p for p in phrases if p in said], (loc, value, problem)
                assert "Input should" not in said and "Value error" not in said, (loc, value, problem)
    assert seen > 100  # pydantic did refuse many of these: the check above had something to catch


@pytest.mark.parametrize(("loc", "wrong", "meant"), [
    (("transfr",), {"backend": "nixl"}, "transfer"),
    (("model", "context_lenght"), 1000, "context_length"),
    (("router", "polcy"), "random", "policy"),
    (("prefill", "mem_fraction"), 0.8, "mem_fraction_static"),
    (("systemd", "start_timeout"), 60, "start_timeout_sec"),
])
def test_a_misspelled_key_gets_did_you_mean(reference_data, loc, wrong, meant):
    (problem,) = problems_of(put(reference_data, loc, wrong))
    assert problem.message.startswith("is not a field of ")
    assert problem.fix.startswith(f'did you mean "{meant}"? remove it or correct its spelling')


@pytest.mark.parametrize(("loc", "wrong", "meant"), [
    (("router", "policy"), "round-robin", "round_robin"),
    (("router", "policy"), "CacheAware", "cache_aware"),
    (("transfer", "backend"), "nxil", "nixl"),
    (("boot_layout",), "PD", "pd"),
    (("decode", "attention_kernels"), "pdsrve", "pdserve"),
    (("model", "reasoning_parser"), "deepseek_v4", "deepseek-v4"),
    (("model", "tool_call_parser"), "deepseek-v4", "deepseekv4"),
])
def test_a_misspelled_value_gets_did_you_mean(reference_data, loc, wrong, meant):
    (problem,) = problems_of(put(reference_data, loc, wrong))
    assert problem.value == wrong and f'did you mean "{meant}"? use one of: ' in problem.fix


def test_a_misspelled_required_key_is_one_error_not_two(reference_data):
    data = copy.deepcopy(reference_data)
    data["prefill"]["prot"] = data["prefill"].pop("port")
    (problem,) = problems_of(data)
    assert problem.field == "prefill.prot" and 'did you mean "port"?' in problem.fix
    # A key nobody could have meant for the missing one leaves both errors: two causes.
    data["prefill"]["zzz"] = data["prefill"].pop("prot")
    assert sorted(p.field for p in problems_of(data)) == ["prefill.port", "prefill.zzz"]


def test_a_misspelled_host_address_is_one_error(tmp_path):
    from tests.unit.test_check_all_problems import example

    data = example("two-host")
    data["hosts"]["gpu-b"]["adress"] = data["hosts"]["gpu-b"].pop("address")
    errors = [p for p in problems_of(data) if p.severity == "error"]
    assert [(p.field, p.fix.split("?")[0]) for p in errors] == [("hosts.gpu-b.adress", 'did you mean "address"')]


@pytest.mark.parametrize(("name", "text", "checked"), [
    ("d.toml", "[model\n", "the TOML syntax, which failed: no field was reached"),
    ("d.json", "[1]", "the JSON syntax and the document's shape, which failed: no field was reached"),
    ("d.yaml", "name: x", "the file's name, which failed: no field was reached"),
])
def test_a_file_that_stops_the_check_says_how_far_it_got(tmp_path, name, text, checked):
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "--json", "-c", str(path)])
    assert result.exit_code == 1 and json.loads(result.stdout)["checked"] == [checked]
    missing = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "-c", str(tmp_path / "none.toml")])
    assert "checked: reading the file, which failed: no field was reached)" in missing.stdout
