"""End-to-end and exposure check logic on recorded client results."""

from pdserve.probes.observations import AuthObs, ChatObs, PortProbe, StreamObs, ToolCallObs
from pdserve.schema.loading import load
from pdserve.verify.checks import e2e, exposure, versions
from pdserve.verify.expect import expectations

DEP = load().deployment
EXP = expectations(DEP)


def test_chat_needs_text():
    assert e2e.check_chat(EXP, ChatObs(content="Hello!", finish_reason="stop")).status == "pass"
    assert e2e.check_chat(EXP, ChatObs(content="  ")).status == "fail"


def test_failed_request_says_what_failed():
    result = e2e.check_chat(EXP, ChatObs(error="InternalServerError: KV transfer failed", status=500))
    assert result.status == "fail" and "KV transfer failed" in result.observed
    assert "journalctl -u sglang-dsv4-router" in result.remediation
    unauthorized = e2e.check_chat(EXP, ChatObs(error="AuthenticationError", status=401))
    assert "api_key_file" in unauthorized.remediation


def test_reasoning_separated_passes():
    obs = ChatObs(content="42", reasoning_content="17 + 25 = 42")
    assert e2e.check_reasoning(EXP, obs).status == "pass"


def test_reasoning_left_in_content_fails():
    obs = ChatObs(content="17 + 25 = 42</think>42", reasoning_content=None)
    result = e2e.check_reasoning(EXP, obs)
    assert result.status == "fail" and "--reasoning-parser deepseek-v4 to BOTH SGLang servers" in result.remediation


def test_reasoning_skips_without_a_parser():
    exp = expectations(DEP.model_copy(update={"model": DEP.model.model_copy(update={"reasoning_parser": None})}))
    assert e2e.check_reasoning(exp, ChatObs()).status == "skip"


TWO = (ToolCallObs("get_weather", '{"city": "Paris"}'), ToolCallObs("get_time", '{"city": "Tokyo"}'))


def test_two_parsed_tool_calls_pass():
    result = e2e.check_tools(EXP, ChatObs(tool_calls=TWO, finish_reason="tool_calls"))
    assert result.status == "pass" and result.observed.startswith("2 tool_calls: get_weather")


def test_unparsed_or_broken_tool_calls_fail():
    raw = ChatObs(content='<｜DSML｜tool_calls><｜DSML｜invoke name="get_weather">{}</｜DSML｜invoke>', tool_calls=())
    assert "--tool-call-parser deepseekv4" in e2e.check_tools(EXP, raw).remediation
    bad = ChatObs(tool_calls=(TWO[0], ToolCallObs("get_time", '{"city": ')))
    result = e2e.check_tools(EXP, bad)
    assert result.status == "fail" and "call 1 (get_time) arguments are not JSON" in result.details[0]
    one = e2e.check_tools(EXP, ChatObs(tool_calls=TWO[:1]))
    assert one.status == "fail" and one.observed.startswith("1 tool_calls")


def test_stream_needs_chunks_finish_and_usage():
    good = StreamObs(chunks=9, content_chunks=7, content="Hello there", usage={"prompt_tokens": 5,
                     "completion_tokens": 7}, finish_reason="stop")
    assert e2e.check_stream(EXP, good).status == "pass"
    one_chunk = StreamObs(chunks=3, content_chunks=1, usage=good.usage, finish_reason="stop")
    assert "did not arrive incrementally" in e2e.check_stream(EXP, one_chunk).details[0]
    no_usage = StreamObs(chunks=8, content_chunks=7, finish_reason="stop")
    assert "no usage chunk" in e2e.check_stream(EXP, no_usage).details[0]


def test_ports_closed_beyond_loopback_pass_open_fail():
    closed = [PortProbe("10.0.0.5", 30000, "prefill port", False, "Connection refused")]
    assert exposure.check_ports(EXP, ["10.0.0.5"], closed).status == "pass"
    opened = [PortProbe("10.0.0.5", 30002, "decode port", True)]
    result = exposure.check_ports(EXP, ["10.0.0.5"], closed + opened)
    assert result.status == "fail" and "decode port 30002 reachable at 10.0.0.5" in result.details
    assert exposure.check_ports(EXP, [], []).status == "skip"


def test_ports_open_by_choice_warn():
    dep = DEP.model_copy(update={"decode": DEP.decode.model_copy(update={"allow_non_loopback": True,
                                                                         "host": "0.0.0.0"})})
    result = exposure.check_ports(expectations(dep), ["10.0.0.5"], [PortProbe("10.0.0.5", 30002, "decode port", True)])
    assert result.status == "warn"


def test_auth():
    keyed = expectations(DEP.model_copy(update={"router": DEP.router.model_copy(update={"api_key_file": "/k"})}))
    assert exposure.check_auth(keyed, AuthObs(401, 200)).status == "pass"
    open_router = exposure.check_auth(keyed, AuthObs(200, 200))
    assert open_router.status == "fail" and "started without --api-key" in open_router.remediation
    assert exposure.check_auth(keyed, AuthObs(401, 401)).status == "fail"
    unreadable = exposure.check_auth(keyed, None, "cannot read the API key file /k: Permission denied")
    assert unreadable.status == "fail" and "--api-key-file" in unreadable.remediation
    assert exposure.check_auth(EXP, None).status == "skip"  # no key, loopback router
    public = expectations(DEP.model_copy(update={"router": DEP.router.model_copy(update={"host": "0.0.0.0"})}))
    assert exposure.check_auth(public, None).status == "warn"


def test_router_version_pin():
    assert versions.check_router_version(EXP, "1.13.0", "pid 1").status == "pass"
    assert versions.check_router_version(EXP, "0.3.2", "pid 1").status == "fail"
