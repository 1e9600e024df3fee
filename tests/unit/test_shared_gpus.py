"""Prefill and decode on the same GPU: refused unless allow_shared_gpus is set, and then only with memory
fractions that leave room for both servers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.argv import server_args
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError, Severity


def one_gpu(data, prefill=0.25, decode=0.25, shared=True):
    """The reference deployment squeezed onto GPU 0 (the fallback too), as on a one-GPU test rig."""
    for role, fraction in (("prefill", prefill), ("decode", decode)):
        data[role]["gpus"] = [0]
        data[role]["mem_fraction_static"] = fraction
        data[role].pop("tp_size", None)
    data["fallback"]["gpus"] = [0]
    data["fallback"].pop("tp_size", None)
    if shared is not None:
        data["allow_shared_gpus"] = shared
    return data


def problems_of(data):
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "test")
    return caught.value.problems


def test_a_shared_gpu_without_the_flag_is_refused_and_the_fix_names_the_flag(reference_data):
    problems = problems_of(one_gpu(reference_data, shared=None))
    assert [p.field for p in problems] == ["decode.gpus"]
    assert "shares GPU(s) [0] with prefill.gpus [0]" in problems[0].message
    assert "allow_shared_gpus = true" in problems[0].fix and "0.9" in problems[0].fix


def test_an_explicit_false_is_the_default(reference_data):
    assert [p.field for p in problems_of(one_gpu(reference_data, shared=False))] == ["decode.gpus"]


def test_shared_gpu_with_the_flag_and_small_fractions_loads_and_renders_both_on_gpu_0(reference_data):
    loaded = deployment_from_data(one_gpu(reference_data), "test")
    assert loaded.warnings == []
    dep = loaded.deployment
    assert dep.allow_shared_gpus is True
    for role in ("prefill", "decode"):
        argv = server_args(dep, role)
        assert argv[argv.index("--base-gpu-id") + 1] == "0"
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.25"


def test_fractions_adding_up_to_exactly_the_limit_are_accepted(reference_data):
    assert deployment_from_data(one_gpu(reference_data, 0.45, 0.45), "test").warnings == []
    assert deployment_from_data(one_gpu(reference_data, 0.6, 0.3), "test").warnings == []


@pytest.mark.parametrize("prefill, decode, total", [(0.5, 0.5, "1"), (0.85, 0.85, "1.7"), (0.46, 0.45, "0.91")])
def test_fractions_that_leave_no_room_for_both_are_refused_with_field_value_and_fix(reference_data, prefill, decode,
                                                                                    total):
    problems = problems_of(one_gpu(reference_data, prefill, decode))
    assert len(problems) == 1, [p.line() for p in problems]
    problem = problems[0]
    assert (problem.field, problem.value, problem.severity) == ("decode.mem_fraction_static", decode, Severity.ERROR)
    assert f"prefill.mem_fraction_static {prefill:g}" in problem.message
    assert f"take {total} of its memory" in problem.message
    assert "add up to at most 0.9, e.g. 0.45 each" in problem.fix


def test_partly_overlapping_gpu_sets_are_held_to_the_same_limit(reference_data):
    reference_data["allow_shared_gpus"] = True
    reference_data["decode"]["gpus"] = [3, 4, 5, 6]  # shares GPU 3 with prefill [0, 1, 2, 3]
    problems = problems_of(reference_data)  # both at the reference's 0.85
    assert [p.field for p in problems] == ["decode.mem_fraction_static"]
    assert "same GPU(s) [3]" in problems[0].message


def test_the_flag_on_disjoint_gpus_is_a_warning_not_an_error(reference_data):
    reference_data["allow_shared_gpus"] = True
    loaded = deployment_from_data(reference_data, "test")
    assert [(p.field, p.severity) for p in loaded.warnings] == [("allow_shared_gpus", Severity.WARNING)]
    assert "share no GPU" in loaded.warnings[0].message
    assert "remove allow_shared_gpus" in loaded.warnings[0].fix


def test_pdserve_check_prints_the_fraction_problem_as_one_line_and_exits_1(reference_data, tmp_path):
    path = tmp_path / "one-gpu.json"
    path.write_text(json.dumps(one_gpu(reference_data, 0.5, 0.5)))
    result = CliRunner().invoke(main, ["check", "-c", str(path), "--no-host", "--no-parsers"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert lines == [line for line in lines if line.startswith("error: decode.mem_fraction_static = 0.5: ")]
    assert len(lines) == 1, result.output


def _after(dep, tools, unit):
    from pdserve.render.units import render_units

    text = {u.name: u.text for u in render_units(dep, tools, "/etc/pdserve/dsv4.json")}[unit]
    return next(line.split("=", 1)[1].split() for line in text.splitlines() if line.startswith("After="))


def test_on_a_shared_gpu_the_decode_starts_after_a_ready_prefill(reference_data, reference, tools):
    shared = deployment_from_data(one_gpu(reference_data), "test").deployment
    # Both servers size their pools from the memory free when they start: the decode must not start with the prefill.
    assert "sglang-dsv4-prefill.service" in _after(shared, tools, "sglang-dsv4-decode")
    assert "sglang-dsv4-decode.service" not in _after(shared, tools, "sglang-dsv4-prefill")
    # On their own GPUs they start in parallel, as before.
    assert "sglang-dsv4-prefill.service" not in _after(reference, tools, "sglang-dsv4-decode")
