"""End to end through the router, judged on what the official openai client returned."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pdserve.probes.http import NotJson, parse_json
from pdserve.probes.observations import ChatObs, StreamObs
from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed, skipped

THINK_MARKERS = ("</think>", "<think>")
DSML_MARKER = "｜DSML｜"


def _request_failed(cid: str, obs: ChatObs | StreamObs, expected: str, exp: Expectations) -> CheckResult:
    status = getattr(obs, "status", None)
    hint = ("the router refused the API key: check router.api_key_file and run the verifier as a user that can "
            "read it" if status == 401 else
            f"read `journalctl -u {exp.router_unit}` and of both workers; a 5xx from the router means a worker "
            "failed the request (KV transfer, bootstrap port, or a crash)")
    return failed(cid, f"request failed: {obs.error}", expected, hint)


def _not_the_api(cid: str, obs: ChatObs | StreamObs, expected: str, exp: Expectations) -> CheckResult | None:
    """The failure when the request failed or the answer is not in the OpenAI format; else None."""
    if obs.error:
        return _request_failed(cid, obs, expected, exp)
    if obs.unexpected:
        return failed(cid, f"unexpected answer: {obs.unexpected.observed}", f"{expected}; {obs.unexpected.expected}",
                      f"the answer through {exp.router_url} is not the OpenAI chat completions format: something "
                      f"other than the router answers on its port, or the router and SGLang versions disagree "
                      f"(see versions.*); `journalctl -u {exp.router_unit}`")
    return None


# check id -> the model field naming its parser, an example value, what the parser produces, what it does.
PARSER_CHECKS = {
    "e2e.reasoning": ("reasoning_parser", "deepseek-v4", "separated reasoning", "separate reasoning"),
    "e2e.tools": ("tool_call_parser", "deepseekv4", "parsed tool calls", "parse tool calls"),
}


def _before_judging(cid: str, obs: ChatObs | None, expected: str, exp: Expectations) -> CheckResult | None:
    """What a parser's check says before there is an answer to judge: a skip when the deployment sets no
    such parser (SGLang does the job only with one), the failure when the request itself failed; else None."""
    parser, example, result, job = PARSER_CHECKS[cid]
    if getattr(exp, parser) is None:
        return skipped(cid, f"model.{parser} is not set, so no {result} is expected", expected,
                       f"set model.{parser} (e.g. {example}) to have SGLang {job}")
    assert obs is not None  # the runner sends the request whenever the parser is set
    return _not_the_api(cid, obs, expected, exp)


def _short(text: str | None, n: int = 80) -> str:
    if text is None:
        return "None"
    text = text.replace("\n", " ")
    return repr(text if len(text) <= n else text[:n] + "...")


@dataclass(frozen=True)
class Verdict:
    """A judge's reading of an answer its check's guard let through: what it observed, whether that fails the
    check, the fix a failure names and the problems it found (the failure's details)."""

    observed: str
    failing: bool
    fix: str
    problems: list[str] = field(default_factory=list)


Obs = TypeVar("Obs", ChatObs, StreamObs)
Judge = Callable[[Expectations, Obs], Verdict]
Check = Callable[[Expectations, Obs], CheckResult]
# _not_the_api or _before_judging. Each takes every answer its checks' judges take; the check takes what its
# judge takes (Any here, so that the judge's type, not the guard's, is the check's).
Guard = Callable[[str, Any, str, Expectations], CheckResult | None]


def _check(cid: str, expected: str, guard: Guard) -> Callable[[Judge[Obs]], Check[Obs]]:
    """The check `cid` made of a judge: first what `guard` says (the request failed, the answer is not the
    API's, the check does not apply), else the judge's verdict as a pass or a failure."""
    def make(judge: Judge[Obs]) -> Check[Obs]:
        @functools.wraps(judge)
        def check(exp: Expectations, obs: Obs) -> CheckResult:
            unjudged = guard(cid, obs, expected, exp)
            if unjudged:
                return unjudged
            verdict = judge(exp, obs)
            if verdict.failing:
                return failed(cid, verdict.observed, expected, verdict.fix, verdict.problems)
            return passed(cid, verdict.observed, expected)
        return check
    return make


@_check("e2e.chat", "a non-empty assistant reply", _not_the_api)
def check_chat(exp: Expectations, obs: ChatObs) -> Verdict:
    return Verdict(f"content {_short(obs.content)}, finish_reason={obs.finish_reason}",
                   failing=not (obs.content or "").strip(),
                   fix="the decode server answered with no text: check its journal")


@_check("e2e.reasoning", "with chat_template_kwargs thinking=true: reasoning in reasoning_content, none in content",
        _before_judging)
def check_reasoning(exp: Expectations, obs: ChatObs) -> Verdict:
    leaked = any(m in (obs.content or "") for m in THINK_MARKERS)
    return Verdict(f"reasoning_content {_short(obs.reasoning_content)}, content {_short(obs.content)}",
                   failing=not (obs.reasoning_content or "").strip() or leaked,
                   fix=f"pass --reasoning-parser {exp.reasoning_parser} to BOTH SGLang servers "
                   "(model.reasoning_parser; the router does not parse in PD mode) and restart them; if it is set, "
                   "the parser does not match the model's output format")


@_check("e2e.tools", "2 parsed tool_calls, each with a name and JSON-object arguments", _before_judging)
def check_tools(exp: Expectations, obs: ChatObs) -> Verdict:
    problems = []
    for i, call in enumerate(obs.tool_calls):
        try:
            args = parse_json((call.arguments or "").encode("utf-8", errors="surrogatepass"))
        except NotJson as exc:
            problems.append(f"call {i} ({call.name}) arguments are not JSON: {exc}")
            continue
        if not isinstance(args, dict):
            problems.append(f"call {i} ({call.name}) arguments are {type(args).__name__}, not an object")
        if not call.name:
            problems.append(f"call {i} has no function name")
    calls = ", ".join(f"{c.name}({c.arguments})" for c in obs.tool_calls) or "none"
    return Verdict(f"{len(obs.tool_calls)} tool_calls: {calls}; finish_reason={obs.finish_reason}; "
                   f"content {_short(obs.content)}",
                   failing=DSML_MARKER in (obs.content or "") or len(obs.tool_calls) != 2 or bool(problems),
                   fix=f"pass --tool-call-parser {exp.tool_call_parser} to BOTH SGLang servers "
                   "(model.tool_call_parser; the router does not parse in PD mode); raw tool-call markup in content "
                   "means no parser ran",
                   problems=problems)


@_check("e2e.stream", "several content chunks, a finish_reason, and a usage chunk (stream_options.include_usage)",
        _not_the_api)
def check_stream(exp: Expectations, obs: StreamObs) -> Verdict:
    usage = obs.usage or {}
    problems = []
    if obs.content_chunks < 2:
        problems.append("the reply did not arrive incrementally (fewer than 2 content chunks)")
    if not obs.finish_reason:
        problems.append("no chunk carried a finish_reason")
    if not obs.usage or not usage.get("completion_tokens"):
        problems.append("no usage chunk with completion_tokens")
    return Verdict(f"{obs.chunks} chunks ({obs.content_chunks} with content), finish_reason={obs.finish_reason}, "
                   f"usage={ {k: usage.get(k) for k in ('prompt_tokens', 'completion_tokens')} if obs.usage else None}",
                   failing=bool(problems),
                   fix="something between client and decode server buffers or rewrites the stream (a proxy, or a "
                   "router/server version mismatch): check versions.* and any proxy in front of the router",
                   problems=problems)
