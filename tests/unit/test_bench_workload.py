"""`pdserve bench`'s workloads (issue 40): the built-ins read as they stand, and every workload that
cannot run is refused with its field, its value and a fix, before anything is sent."""

from __future__ import annotations

import math

import pytest

from pdserve.bench import workload as wl

BASE = {"input_len": 128, "output_len": 32, "request_rates": [1, 2], "duration_s": 10}


def problems_of(table, name="w"):
    found, problems = wl.read_workload(name, table)
    assert (found is None) == bool(problems)
    return problems


@pytest.mark.parametrize("name", sorted(wl.BUILT_IN))
def test_every_built_in_workload_reads_and_fits_the_reference_context(name):
    found, problems = wl.read_workload(name, wl.BUILT_IN[name])
    assert problems == [] and found is not None
    assert wl.fit_problems(found, 65536, "/m", ["tokenizer.json"]) == []
    assert found.points() and all(p.prompts >= 1 for p in found.points())


def test_a_rate_sweep_sends_rate_times_duration_prompts_per_point():
    found, _ = wl.read_workload("w", {**BASE, "request_rates": [0.5, 3]})
    assert [(p.kind, p.value, p.prompts) for p in found.points()] == [("rate", 0.5, 5), ("rate", 3.0, 30)]
    fixed, _ = wl.read_workload("w", {**BASE, "prompts": 7})
    assert [p.prompts for p in fixed.points()] == [7, 7]


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"request_rates": [0]}, "request_rates", "a rate of 0 sends nothing"),
    ({"request_rates": [1, -2]}, "request_rates", "not a positive"),
    ({"request_rates": [math.nan]}, "request_rates", "not a positive"),
    ({"request_rates": [math.inf]}, "request_rates", "not a positive"),
    ({"request_rates": [True]}, "request_rates", "not a positive"),
    ({"request_rates": []}, "request_rates", "1 to 32 values"),
    ({"request_rates": [1, 1]}, "request_rates", "twice"),
    ({"input_len": 0}, "input_len", "whole number from 1"),
    ({"input_len": 1.5}, "input_len", "whole number"),
    ({"input_len": "128"}, "input_len", "whole number"),
    ({"output_len": 10**30}, "output_len", "whole number"),
    ({"seed": -1}, "seed", "whole number from 0"),
    ({"range_ratio": 0}, "range_ratio", "above 0"),
    ({"slo_ttft_ms": math.inf}, "slo_ttft_ms", "finite"),
    ({"duration_s": 10**9}, "duration_s", "at most"),
    ({"request_rates": [1000], "duration_s": 1000}, "duration_s", "more than 100000 prompts"),
    ({"concurrencies": [1]}, "request_rates", "exactly one sweep"),
    ({"colour": "red"}, "colour", "is not a workload field"),
    ({"input_lenn": 3}, "input_lenn", 'did you mean "input_len"'),
])
def test_a_workload_that_cannot_run_is_refused_with_field_value_and_fix(change, field, words):
    problems = problems_of({**BASE, **change})
    wanted = [p for p in problems if p.field == f"workloads.w.{field}"]
    assert wanted, [p.line() for p in problems]
    line = wanted[0].line()
    assert words in line and "fix:" in line, line


def test_a_concurrency_sweep_needs_its_prompts_and_a_rate_sweep_its_length():
    closed = problems_of({"input_len": 8, "output_len": 8, "concurrencies": [1, 4]})
    assert [p.field for p in closed] == ["workloads.w.prompts"]
    open_loop = problems_of({"input_len": 8, "output_len": 8, "request_rates": [1]})
    assert [p.field for p in open_loop] == ["workloads.w.duration_s"]
    missing = problems_of({"output_len": 8, "request_rates": [1], "prompts": 3})
    assert [p.field for p in missing] == ["workloads.w.input_len"] and "required" in missing[0].message


def test_hostile_names_and_tables_are_refused_not_crashed_on():
    assert problems_of({}, name="Bad Name")[0].field == "workloads"
    assert "must be a table" in problems_of([1, 2])[0].message
    _, problems = wl.workloads({"workloads": "x"})
    assert problems and problems[0].field == "workloads"
    _, stray = wl.workloads({"workload": {"a": {}}})
    assert stray and "[workloads.NAME]" in stray[0].fix


def test_a_file_adds_and_replaces_workloads_and_an_unknown_name_gets_a_suggestion():
    tables, problems = wl.workloads({"workloads": {"chat": {**BASE, "input_len": 64}, "mine": BASE}})
    assert problems == [] and {"mine", "smoke"} <= set(tables) and tables["chat"]["input_len"] == 64
    _, wrong = wl.pick(tables, "chta")
    assert wrong[0].field == "--workload" and 'did you mean "chat"' in wrong[0].fix


def test_input_longer_than_the_context_is_refused_with_the_length_that_fits():
    found, _ = wl.read_workload("w", {**BASE, "input_len": 4000, "output_len": 200})
    problems = wl.fit_problems(found, 4096, "/m", ["tokenizer.json"])
    assert [p.field for p in problems] == ["workloads.w.input_len"]
    assert problems[0].value == 4000 and "4200 tokens" in problems[0].message and "at most 3896" in problems[0].fix
    assert wl.fit_problems(found, None, "/m", ["tokenizer.json"]) == []  # no context length set: SGLang's own


def test_a_model_directory_without_a_tokenizer_or_unreadable_is_refused():
    found, _ = wl.read_workload("w", BASE)
    bare = wl.fit_problems(found, 8192, "/models/x", ["config.json", "model.safetensors"])
    assert [(p.field, p.value) for p in bare] == [("model.path", "/models/x")] and "no tokenizer" in bare[0].message
    unreadable = wl.fit_problems(found, 8192, "/models/x", None)
    assert "cannot be read" in unreadable[0].message
    assert wl.fit_problems(found, 8192, "/m", ["tokenizer_config.json", "tokenizer.model"]) == []
