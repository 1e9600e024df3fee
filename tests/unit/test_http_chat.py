"""The end-to-end chat probes (the official openai client over pdserve's bounded client) and the e2e checks
against misbehaving routers: every odd answer fails its check naming what came and what should have."""

from __future__ import annotations

import time

import pytest

from pdserve.probes import chat
from pdserve.verify.checks import e2e
from pdserve.verify.expect import expectations
from pdserve.verify.result import Status
from tests.fixtures import misbehaving_server as ms

DEADLINE = 1.0
SLACK = 0.5
PATH = "/v1/chat/completions"


def completion(**fields) -> dict:
    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    return {**body, **fields}


def message(**fields) -> dict:
    return completion(choices=[{"index": 0, "message": {"role": "assistant", **fields}, "finish_reason": "stop"}])


@pytest.fixture
def exp(reference):
    return expectations(reference)


def _ask(behaviour, probe=chat.plain, seconds: float = DEADLINE):
    with ms.serving({PATH: behaviour}) as router, chat.client(router.url, None, seconds) as c:
        began = time.monotonic()
        seen = probe(c, "m")
        return time.monotonic() - began, seen


def test_a_well_formed_answer_passes(exp):
    _, seen = _ask(ms.answer(200, completion()))
    assert seen.content == "Hello." and e2e.check_chat(exp, seen).status is Status.PASS


@pytest.mark.parametrize(("probe", "behaviour"), [
    (chat.plain, ms.slow_headers), (chat.plain, ms.slow_body), (chat.stream, ms.endless_stream),
    (chat.stream, ms.slow_body)], ids=["slow headers", "slow body", "endless stream", "slow stream"])
def test_the_chat_deadline_bounds_the_whole_exchange(exp, probe, behaviour):
    took, seen = _ask(behaviour, probe)
    assert took <= DEADLINE + SLACK, f"took {took:.2f} s"
    assert "no complete answer within 1 s" in seen.error
    check = e2e.check_stream if probe is chat.stream else e2e.check_chat
    result = check(exp, seen)
    assert result.status is Status.FAIL and "no complete answer within 1 s" in result.observed


def test_a_huge_answer_is_cut(exp):
    _took, seen = _ask(ms.huge_body(256 * 1024 * 1024))
    assert f"answer larger than {chat.CHAT_MAX_BYTES} bytes after decompression" in seen.error
    assert e2e.check_chat(exp, seen).status is Status.FAIL


@pytest.mark.parametrize("status", [307, 308])
def test_a_redirect_fails_naming_the_location_and_goes_nowhere(exp, status):
    with ms.serving({"*": ms.answer(200, completion())}) as elsewhere:
        _took, seen = _ask(ms.redirect(status, f"{elsewhere.url}{PATH}"))
    assert elsewhere.requests == []
    result = e2e.check_chat(exp, seen)
    assert result.status is Status.FAIL
    assert f"HTTP {status}, a redirect to '{elsewhere.url}{PATH}' (not followed)" in result.observed


@pytest.mark.parametrize(("answer", "observed", "expected"), [
    (b"", "an empty body", "a JSON object"),
    (b"<html>busy</html>", "not JSON", "a JSON object"),
    (ms.DEEP, "nested deeper than 32 levels", "a JSON object"),
    ({"choices": 7}, "choices = 7 (an integer)", "choices: a list"),
    ({"choices": []}, "choices = [] (a list)", "choices: a non-empty list"),
    (completion(choices=[{"index": 0, "message": None}]), "choices.0.message = None (null)", "an object"),
    (message(content=5), "content = 5 (an integer)", "content: a string"),
    (message(tool_calls=[{"type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}]),
     "arguments = {'city': 'Paris'} (an object)", "arguments: a string"),
    (completion(usage={"prompt_tokens": "5", "completion_tokens": 2, "total_tokens": 7}),
     "usage.prompt_tokens = '5' (a string)", "usage.prompt_tokens: an integer"),
    (completion(usage={"prompt_tokens": True, "completion_tokens": 2, "total_tokens": 7}),
     "usage.prompt_tokens = True (a boolean)", "an integer"),
    ('{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": ' + ms.HUGE_INT + "}}",
     "an integer of 400 digits", "a JSON object"),
], ids=["empty", "html", "deep", "choices 7", "no choice", "null message", "int content", "object arguments",
        "string usage", "bool usage", "400 digits"])
def test_an_answer_not_in_the_api_fails_with_observed_and_expected(exp, answer, observed, expected):
    _, seen = _ask(ms.answer(200, answer))
    assert seen.unexpected is not None, seen
    result = e2e.check_chat(exp, seen)
    assert result.status is Status.FAIL
    assert observed in result.observed and result.observed.startswith("unexpected answer: ")
    assert expected in result.expected and "a non-empty assistant reply" in result.expected


def test_tool_arguments_that_are_not_a_json_object_fail_the_tools_check(exp):
    calls = [{"id": str(i), "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
             for i, arguments in enumerate(["[" * 50_000, '{"city": ' + ms.HUGE_INT + "}"])]
    _, seen = _ask(ms.answer(200, message(content=None, tool_calls=calls)), chat.tools)
    result = e2e.check_tools(exp, seen)
    assert result.status is Status.FAIL
    assert any("nested deeper than" in d for d in result.details), result.details
    assert any("an integer of 400 digits" in d for d in result.details), result.details


def _sse(*events: bytes) -> ms.Behaviour:
    body = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return ms.answer(200, body, {"Content-Type": "text/event-stream"})


@pytest.mark.parametrize(("events", "observed"), [
    ((b'{"choices": 7}',), "stream chunk 0 choices = 7"),
    ((b'{"choices": [{"delta": null}]}',), "stream chunk 0 choices.0.delta = None"),
    ((b'{"choices": [{"delta": {"content": "a"}}]}', b"not json"), "stream chunk 1: not JSON"),
    ((b'{"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": -1, "total_tokens": 0}}',),
     "usage.completion_tokens = -1"),
], ids=["choices 7", "null delta", "not json", "negative usage"])
def test_a_stream_chunk_not_in_the_api_fails_the_stream_check(exp, events, observed):
    _, seen = _ask(_sse(*events), chat.stream)
    result = e2e.check_stream(exp, seen)
    assert result.status is Status.FAIL and observed in result.observed, result.observed


def test_a_stream_in_the_api_passes(exp):
    chunks = [b'{"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}',
              b'{"choices": [{"index": 0, "delta": {"content": "lo."}, "finish_reason": "stop"}]}',
              b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}']
    _, seen = _ask(_sse(*chunks), chat.stream)
    assert seen.content == "Hello." and e2e.check_stream(exp, seen).status is Status.PASS


def test_the_auth_probe_is_bounded_too():
    with ms.serving({PATH: ms.slow_headers}) as router:
        began = time.monotonic()
        seen = chat.auth(router.url, "m", "key", DEADLINE)
    assert time.monotonic() - began <= DEADLINE + SLACK
    assert seen.without_key is None and "no complete answer within 1 s" in seen.error
