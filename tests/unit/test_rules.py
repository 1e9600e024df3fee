"""Each validation rule, asserted on the message a user would read."""

from __future__ import annotations

import pytest

from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError, Severity


def problems_of(data):
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "test")
    return caught.value.problems


def one_problem(data, field):
    matching = [p for p in problems_of(data) if p.field == field]
    assert len(matching) == 1, [p.line() for p in problems_of(data)]
    return matching[0]


def test_reference_deployment_is_valid_without_warnings(reference_data):
    loaded = deployment_from_data(reference_data, "test")
    assert loaded.deployment.name == "dsv4"
    assert loaded.warnings == []


def test_overlapping_gpus_name_the_shared_gpu(reference_data):
    reference_data["decode"]["gpus"] = [3, 4, 5, 6]
    problem = one_problem(reference_data, "decode.gpus")
    assert "shares GPU(s) [3] with prefill.gpus [0, 1, 2, 3]" in problem.message
    assert "disjoint" in problem.fix


def test_tp_size_must_equal_gpu_count(reference_data):
    reference_data["prefill"]["tp_size"] = 8
    problem = one_problem(reference_data, "prefill.tp_size")
    assert problem.value == 8
    assert "(4)" in problem.message
    assert "tp_size = 4" in problem.fix


def test_gpu_sets_must_be_evenly_spaced(reference_data):
    reference_data["decode"]["gpus"] = [4, 5, 7]
    problem = one_problem(reference_data, "decode.gpus")
    assert "--base-gpu-id/--gpu-id-step" in problem.message


def test_duplicate_gpu_in_a_role(reference_data):
    reference_data["decode"]["gpus"] = [4, 4, 5, 6]
    assert "twice" in one_problem(reference_data, "decode.gpus").message


@pytest.mark.parametrize(
    "field, section, key",
    [
        ("decode.port", "decode", "port"),
        ("router.port", "router", "port"),
        ("router.prometheus_port", "router", "prometheus_port"),
        ("transfer.bootstrap_port", "transfer", "bootstrap_port"),
    ],
)
def test_ports_must_be_distinct(reference_data, field, section, key):
    reference_data[section][key] = reference_data["prefill"]["port"]
    problem = one_problem(reference_data, field)
    assert problem.message == "is already used by prefill.port"


def test_fallback_may_share_only_the_router_port(reference_data):
    reference_data["fallback"]["port"] = reference_data["router"]["port"]
    deployment_from_data(reference_data, "test")  # shared with the router: fine
    reference_data["fallback"]["port"] = reference_data["decode"]["port"]
    problem = one_problem(reference_data, "fallback.port")
    assert "only the router's port may be shared, because the units conflict" in problem.message


def test_workers_stay_on_loopback_unless_allowed(reference_data):
    reference_data["decode"]["host"] = "0.0.0.0"
    problem = one_problem(reference_data, "decode.host")
    assert problem.value == "0.0.0.0"
    assert "allow_non_loopback" in problem.fix
    reference_data["decode"]["allow_non_loopback"] = True
    deployment_from_data(reference_data, "test")


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1])
def test_fractions_strictly_between_zero_and_one(reference_data, value):
    reference_data["prefill"]["mem_fraction_static"] = value
    problem = one_problem(reference_data, "prefill.mem_fraction_static")
    assert problem.fix == "use a fraction strictly between 0 and 1, e.g. 0.85"


# One value set, one problem on one field, and what its message and fix say: (section or None for the
# top level, key, value, field, [(attribute, "==" or "in", text)]).
ONE_VALUE_ONE_PROBLEM = {
    "context length below chunked prefill": ("model", "context_length", 4096, "prefill.chunked_prefill_size",
                                             [("message", "==", "exceeds model.context_length (4096)")]),
    "dashed tool-call parser": ("model", "tool_call_parser", "deepseek-v4", "model.tool_call_parser",
                                [("message", "in", "not a tool-call parser of sglang 0.5.23"),
                                 ("fix", "in", 'did you mean "deepseekv4"?')]),
    "unknown reasoning parser": ("model", "reasoning_parser", "deepseekv4", "model.reasoning_parser",
                                 [("fix", "in", 'did you mean "deepseek-v4"?')]),
    "API key on a command line": ("router", "extra_args", ["--api-key", "sk-secret"], "router.extra_args",
                                  [("message", "in", "ps"), ("fix", "in", "api_key_file")]),
    "API key in the environment": ("environment", "OPENAI_API_KEY", "sk-secret", "environment",
                                   [("message", "in", "looks like a secret")]),
    "relative API key file": ("router", "api_key_file", "keys/router", "router.api_key_file",
                              [("message", "==", "must be an absolute path")]),
    "rendered flag in extra_args": ("decode", "extra_args", ["--port=31000"], "decode.extra_args",
                                    [("fix", "==", "set decode.port instead")]),
    "parser flag on the router": ("router", "extra_args", ["--tool-call-parser", "deepseekv4"], "router.extra_args",
                                  [("fix", "in", "belong on the SGLang servers")]),
    "unknown field": ("router", "prot", 30001, "router.prot",
                      [("message", "==", "is not a field of [router]"),
                       ("fix", "in", 'did you mean "port"? remove it or correct its spelling')]),
    "relative model path": ("model", "path", "./models/dsv4", "model.path", [("fix", "in", "absolute")]),
    "unit-unsafe name": (None, "name", "DSV4 prod", "name", [("message", "in", "unit names")]),
}


@pytest.mark.parametrize("case", list(ONE_VALUE_ONE_PROBLEM))
def test_one_bad_value_is_one_problem_that_says_what_to_do(reference_data, case):
    section, key, value, field, expected = ONE_VALUE_ONE_PROBLEM[case]
    (reference_data if section is None else reference_data[section])[key] = value
    problem = one_problem(reference_data, field)
    for attribute, op, text in expected:
        said = getattr(problem, attribute)
        assert said == text if op == "==" else text in said, (attribute, said)


def test_public_router_without_key_is_a_loud_warning(reference_data):
    reference_data["router"]["host"] = "0.0.0.0"
    loaded = deployment_from_data(reference_data, "test")
    (warning,) = loaded.warnings
    assert warning.severity is Severity.WARNING
    assert warning.field == "router.api_key_file"
    assert "without an API key" in warning.message


def test_missing_field(reference_data):
    del reference_data["prefill"]["port"]
    problem = one_problem(reference_data, "prefill.port")
    assert problem.value is None
    assert problem.message == "is required and missing" and problem.fix.startswith("add it")


def test_every_problem_is_reported_at_once(reference_data):
    reference_data["decode"]["gpus"] = [2, 3, 4, 5]
    reference_data["decode"]["port"] = 30000
    reference_data["decode"]["host"] = "10.0.0.5"
    reference_data["model"]["context_length"] = 1024
    fields = sorted(p.field for p in problems_of(reference_data))
    assert fields == ["decode.gpus", "decode.host", "decode.port", "fallback.chunked_prefill_size",
                      "prefill.chunked_prefill_size"]
