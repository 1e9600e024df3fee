"""KV capacity, resolved server args and versions, judged on recorded /server_info and /model_info."""

from pdserve.probes.observations import HttpObs
from pdserve.schema.loading import load
from pdserve.verify.checks import servers, versions
from pdserve.verify.expect import expectations

EXP = expectations(load().deployment)  # dsv4: context 524288 -> default floor 524288
PREFILL = EXP.workers["prefill"]
DECODE = EXP.workers["decode"]


def info(**overrides):
    body = {"max_total_num_tokens": 1_500_000, "context_length": 524288, "chunked_prefill_size": 8192,
            "tp_size": 4, "mem_fraction_static": 0.80, "disaggregation_mode": "prefill", "version": "0.5.23",
            "reasoning_parser": "deepseek-v4", "tool_call_parser": "deepseekv4"}
    body.update(overrides)
    return HttpObs("http://127.0.0.1:30000/server_info", 200, body)


def model_info(mode="prefill"):
    return HttpObs("http://127.0.0.1:30000/model_info", 200, {"disaggregation_mode": mode,
                   "reasoning_parser": "deepseek-v4", "tool_call_parser": "deepseekv4"})


def test_kv_floor_defaults_to_context_length_and_cli_overrides_it():
    assert EXP.kv_floor == 524288
    assert expectations(load().deployment, kv_floor=5).kv_floor == 5


def test_kv_above_floor_passes():
    result = servers.check_kv(EXP, PREFILL, info(), None)
    assert result.status == "pass" and result.observed == "1500000 tokens (from http://127.0.0.1:30000/server_info)"


def test_kv_below_floor_fails_with_fraction_hint():
    result = servers.check_kv(EXP, DECODE, info(max_total_num_tokens=4096), None)
    assert result.status == "fail" and "4096 tokens" in result.observed
    assert "decode.mem_fraction_static (now 0.85)" in result.remediation


def test_kv_falls_back_to_the_journal_line():
    down = HttpObs("http://127.0.0.1:30002/server_info", None, None, "ConnectError")
    journal = ["[2026] max_total_num_tokens=100000, chunked_prefill_size=8192, context_len=524288",
               "[2026] max_total_num_tokens=2000000, chunked_prefill_size=8192, context_len=524288"]
    result = servers.check_kv(EXP, DECODE, down, journal)
    assert result.status == "pass" and "2000000 tokens (from journal of sglang-dsv4-decode)" == result.observed


def test_kv_without_any_source_fails():
    down = HttpObs("u", None, None, "ConnectError")
    result = servers.check_kv(EXP, DECODE, down, None)
    assert result.status == "fail" and "no journal" in result.observed


def test_server_args_as_configured_pass():
    assert servers.check_server_args(EXP, PREFILL, info(), model_info()).status == "pass"


def test_server_args_mismatch_names_each_field():
    result = servers.check_server_args(EXP, PREFILL, info(context_length=65536, chunked_prefill_size=4096),
                                       model_info())
    assert result.status == "fail"
    assert "context_length: running 65536, configured 524288" in result.details
    assert "chunked_prefill_size: running 4096, configured 8192" in result.details
    assert "systemctl restart sglang-dsv4-prefill" in result.remediation


def test_wrong_disaggregation_mode_points_at_the_port():
    result = servers.check_server_args(EXP, PREFILL, info(), model_info("decode"))
    assert result.status == "fail" and "a different server answers on the prefill port" in result.remediation


def test_version_pin():
    assert versions.check_version(EXP, DECODE, info()).status == "pass"
    result = versions.check_version(EXP, DECODE, info(version="0.5.17"))
    assert result.status == "fail" and "sglang==0.5.23" in result.remediation
