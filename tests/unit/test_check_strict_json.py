"""Strict JSON from every `--json` output, and no non-finite number in any field (issue 37, item 6 and
"Smaller"): `nan`/`inf` in a float field is refused with field, value and fix, and no report ever prints
NaN, Infinity or -Infinity (which are not JSON) or a lone surrogate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.schema import strict_json
from pdserve.schema.loading import default_profile_text, json_schema
from pdserve.schema.problems import Problem
from tests.unit.test_cutover_dry_run import answering

REPO = Path(__file__).resolve().parents[2]


def _refuse_constant(name: str):
    raise AssertionError(f"{name} is not JSON")


def strict_loads(text: str):
    """Parse as a strict RFC 8259 parser would: NaN and infinities fail, and so does a lone surrogate."""
    text.encode("utf-8")  # a lone surrogate in the text cannot be encoded
    data = json.loads(text, parse_constant=_refuse_constant)

    def walk(value) -> None:
        if isinstance(value, str):
            value.encode("utf-8")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(data)
    return data


def _float_fields() -> set[tuple[str, str]]:
    """(model, field) of every number-typed field in the deployment's JSON Schema."""
    found = set()
    for name, definition in json_schema()["$defs"].items():
        for field, spec in definition.get("properties", {}).items():
            kinds = [spec.get("type")] + [option.get("type") for option in spec.get("anyOf", [])]
            if "number" in kinds:
                found.add((name, field))
    return found


# Where each float field is written in the reference data (a single-host file) or in a multi-host one.
FLOAT_FIELDS = {
    ("WorkerSpec", "mem_fraction_static"): ("prefill", "mem_fraction_static"),
    ("FallbackSpec", "mem_fraction_static"): ("fallback", "mem_fraction_static"),
    ("MonitoringSpec", "ttft_p99_seconds"): ("monitoring", "ttft_p99_seconds"),
    ("MonitoringSpec", "kv_usage_threshold"): ("monitoring", "kv_usage_threshold"),
    ("RouterSpec", "retry_backoff_multiplier"): ("router", "retry_backoff_multiplier"),
    ("RouterSpec", "retry_jitter_factor"): ("router", "retry_jitter_factor"),
}
PLACED = ("PlacedWorkerSpec", "mem_fraction_static")  # [[prefill]] of a multi-host file


def test_the_float_fields_tested_here_are_every_float_field_of_the_schema():
    assert _float_fields() == set(FLOAT_FIELDS) | {PLACED}, "add the new float field to FLOAT_FIELDS"


def check_json(tmp_path: Path, text: str, suffix: str = ".json", *extra: str):
    path = tmp_path / f"d{suffix}"
    path.write_text(text)
    return CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "--json", "-c", str(path), *extra])


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", sorted(FLOAT_FIELDS.values()))
def test_a_non_finite_float_is_refused_and_the_report_is_strict_json(tmp_path, reference_data, where, value):
    section, key = where
    reference_data.setdefault(section, {})[key] = value
    result = check_json(tmp_path, json.dumps(reference_data))  # Python writes NaN / Infinity, as some tools do
    assert result.exit_code == 1, result.output
    data = strict_loads(result.stdout)
    (problem,) = [p for p in data["problems"] if p["field"] == f"{section}.{key}"]
    assert problem["value"] == str(value) and "is not a finite number" in problem["message"]
    assert problem["fix"].startswith("write a finite number")


@pytest.mark.parametrize(("literal", "shown"), [("nan", "nan"), ("+inf", "inf"), ("-inf", "-inf"), ("-nan", "nan")])
def test_toml_nan_and_inf_are_refused_in_a_placed_server(tmp_path, literal, shown):
    text = (REPO / "hosts" / "two-host" / "deployment.toml").read_text()
    text = text.replace("mem_fraction_static = 0.80", f"mem_fraction_static = {literal}", 1)
    result = check_json(tmp_path, text, ".toml")
    data = strict_loads(result.stdout)
    (problem,) = [p for p in data["problems"] if p["field"] == "prefill[0].mem_fraction_static"]
    assert problem["value"] == shown and "is not a finite number" in problem["message"]
    # The one-line form says the same, with the value as JSON.
    path = tmp_path / "d.toml"
    lines = CliRunner().invoke(main, ["check", "--no-host", "--no-parsers", "-c", str(path)]).output
    assert f'error: prefill[0].mem_fraction_static = "{shown}": is not a finite number' in lines


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_json_file_with_a_non_finite_number_anywhere_is_refused(tmp_path, reference_data, literal):
    # Also where no float belongs (an integer field, an unknown key): no value is echoed as a bare NaN.
    text = json.dumps(reference_data)
    text = text.replace('"port": 30001', f'"port": {literal}', 1).replace("{", f'{{"unknown": {literal}, ', 1)
    data = strict_loads(check_json(tmp_path, text).stdout)
    found = {p["field"]: p for p in data["problems"]}
    assert "is not a finite number" in found["router.port"]["message"]
    assert "unknown" in found


def test_problem_values_are_made_safe_whatever_they_hold():
    odd = {"a": [math.nan, (math.inf,)], 3: {"s": "\ud800x"}, "set": {2, 1}, "obj": object}
    text = strict_json.dumps(Problem("f", odd, "m", "x").as_dict())
    data = strict_loads(text)
    assert data["value"]["a"] == ["nan", ["inf"]] and data["value"]["3"] == {"s": "\\ud800x"}
    assert data["value"]["set"] == [1, 2]
    assert Problem("f", math.nan, "m", "x").line() == 'error: f = "nan": m; fix: x'


def write(tmp_path: Path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_every_json_output_of_the_cli_is_strict(tmp_path, reference_data):
    two_host = str(REPO / "hosts" / "two-host" / "deployment.toml")
    bad = dict(reference_data, prefill=dict(reference_data["prefill"], mem_fraction_static=math.nan))
    other = json.loads(json.dumps(reference_data))
    other["name"] = "other"
    check = ["check", "--no-host", "--no-parsers", "--json"]
    outputs = {
        "check, valid": ["check", "--no-host", "--no-parsers", "--json"],
        "check, invalid with nan": [*check, "-c", write(tmp_path, "b.json", bad)],
        "check, several files": [*check, write(tmp_path, "a.json", reference_data), write(tmp_path, "o.json", other),
                                 write(tmp_path, "n.json", bad)],
        "check, multi-host": ["check", "--no-host", "--no-parsers", "--json", "-c", two_host],
        "plan": ["plan", "--json", "--sglang-python", "/opt/sglang/bin/python"],
        "plan, one host of several": ["plan", "--json", "-c", two_host, "--host", "gpu-a"],
        "cutover dry run": ["cutover", "pd", "--dry-run", "--json", "--systemctl",
                            answering(tmp_path, {"sglang-dsv4.service"})],
        "cutover dry run, several hosts": ["cutover", "pd", "--dry-run", "--json", "-c", two_host],
        "schema": ["schema"],
    }
    for what, args in outputs.items():
        result = CliRunner().invoke(main, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (what, repr(result.exception))
        assert isinstance(strict_loads(result.stdout), dict), what


def test_the_reference_profile_round_trips_through_strict_json():
    # A sanity anchor for the parser above: it takes real output and refuses Python's extensions.
    assert strict_loads(strict_json.dumps({"text": default_profile_text()}))
    for extension in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(AssertionError):
            strict_loads(f'{{"x": {extension}}}')
