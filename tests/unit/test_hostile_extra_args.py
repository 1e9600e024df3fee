"""Extra args as the real parsers read them (issue 14, item 2): argparse takes an unambiguous prefix
for the flag (`--por` is --port, `--api=K` is --api-key=K), so an abbreviation of a rendered flag or of
a secret flag is refused like the flag itself. tests/integration/test_hostile_parsers.py holds this
reading against the real parsers of sglang 0.5.23 and smg 1.13.0."""

from __future__ import annotations

import pytest

from pdserve.schema.loading import deployment_from_data
from pdserve.schema.problems import ConfigError


def problems(data) -> dict:
    with pytest.raises(ConfigError) as caught:
        deployment_from_data(data, "t")
    return {p.field: p for p in caught.value.problems}


@pytest.mark.parametrize("role", ["prefill", "decode", "fallback", "router"])
@pytest.mark.parametrize("args", [
    ["--api-key", "sk-1"], ["--api-key=sk-1"], ["--api", "sk-1"], ["--api=sk-1"], ["--api-k", "sk-1"],
    ["--api-ke=sk-1"],
])
def test_an_api_key_in_extra_args_is_refused_however_abbreviated(reference_data, role, args):
    reference_data[role]["extra_args"] = args
    problem = problems(reference_data)[f"{role}.extra_args"]
    assert "--api-key" in problem.message and "ps" in problem.message
    assert "api_key_file" in problem.fix


@pytest.mark.parametrize(("role", "arg"), [
    ("prefill", "--admin-api"), ("decode", "--ssl-keyfile-pass=x"), ("router", "--control-plane-api=k"),
    ("router", "--oracle-pass"),
])
def test_other_secret_flags_are_refused_too(reference_data, role, arg):
    reference_data[role]["extra_args"] = [arg, "x"]
    assert "ps" in problems(reference_data)[f"{role}.extra_args"].message


@pytest.mark.parametrize(("role", "args", "flag", "fix"), [
    ("prefill", ["--mem-fraction", "0.9"], "--mem-fraction-static", "prefill.mem_fraction_static"),
    ("decode", ["--por", "1"], "--port", "decode.port"),
    ("decode", ["--port=1"], "--port", "decode.port"),
    ("fallback", ["--tp", "8"], "--tp", "fallback.gpus"),
    ("fallback", ["--tp-s", "8"], "--tp-size", "fallback.gpus"),
    ("prefill", ["--tensor-parallel-size", "8"], "--tensor-parallel-size", "prefill.gpus"),
    ("prefill", ["--tensor-par=8"], "--tensor-parallel-size", "prefill.gpus"),
    ("prefill", ["--model", "/x"], "--model", "model.path"),
    ("prefill", ["--served-model=x"], "--served-model-name", "model.served_name"),
    ("decode", ["--disaggregation-m", "null"], "--disaggregation-mode", "the role itself"),
    ("decode", ["--enable-metrics"], "--enable-metrics", "always"),
    ("router", ["--prometheus-p", "1"], "--prometheus-port", "router.prometheus_port"),
    ("router", ["--health-check-timeout", "1"], "--health-check-timeout-secs", "router.health_check_timeout_secs"),
    ("router", ["--pd-disagg"], "--pd-disaggregation", "the deployment itself"),
])
def test_an_abbreviated_rendered_flag_is_refused_naming_the_field_to_set(reference_data, role, args, flag, fix):
    reference_data[role]["extra_args"] = args
    problem = problems(reference_data)[f"{role}.extra_args"]
    assert problem.value == args[0]
    assert f"{flag} is rendered by pdserve" in problem.message
    assert fix in problem.fix


@pytest.mark.parametrize(("role", "args"), [
    ("prefill", ["--disable-radix-cache"]),
    ("decode", ["--max-total-tokens", "100000"]),
    ("fallback", ["--dp-size", "2", "--enable-dp-attention"]),
    ("router", ["--log-level", "debug"]),
    ("router", ["--max-concurrent-requests=64"]),
])
def test_ordinary_extra_args_still_pass(reference_data, role, args):
    reference_data[role]["extra_args"] = args
    deployment_from_data(reference_data, "t")
