"""End-to-end requests through the router with the official openai client, over pdserve's bounded client.

The openai client sends each request (its auth, its errors for a status that is not 2xx, no retry) over
pdserve.probes.http's client: a deadline on the whole exchange, the stream's every chunk included, a
bound on the body, no redirect followed. The answer itself is read by pdserve into the API's typed shapes
(pdserve.probes.answers), so an answer of the wrong shape is a Mismatch the checks report, not an
exception from deep inside the client.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from types import ModuleType

    import openai
    from openai.types.chat import ChatCompletionMessageParam

from pdserve.probes import http
from pdserve.probes.answers import ChatChunk, ChatCompletion, Mismatch, fit
from pdserve.probes.observations import AuthObs, ChatObs, StreamObs, ToolCallObs

CHAT_MAX_BYTES = 8 * 1024 * 1024  # a 1024-token answer is ~10 KB, streamed ~300 KB
PLAIN: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello in one short sentence."}]
READY: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Reply with the single word: ready"}]
THINK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is 17 + 25? Think it through, then answer with the number."}]
TOOLS_PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Use both tools: get the weather in Paris and the local time in Tokyo."}]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]


def _openai() -> ModuleType:
    # The client library takes most of a second to import; only the end-to-end checks need it, so
    # every other pdserve command (the units' readiness gates among them) starts without it.
    import openai

    return openai


def client(base_url: str, api_key: str | None, timeout: float) -> openai.OpenAI:
    """The caller closes it (closing it closes the HTTP client under it)."""
    # The client needs some key; a router without --api-key ignores it.
    made: openai.OpenAI = _openai().OpenAI(base_url=f"{base_url}/v1", api_key=api_key or "none", timeout=timeout,
                                           max_retries=0, http_client=http.client(timeout, CHAT_MAX_BYTES))
    return made


def _failure(exc: Exception) -> tuple[str, int | None]:
    """The error's text, with what the openai client's wrapping hides: a redirect's Location, the network cause."""
    status = getattr(exc, "status_code", None)
    text = f"{type(exc).__name__}: {exc}"
    response = getattr(exc, "response", None)
    if status is not None and 300 <= status < 400 and response is not None:
        text = f"HTTP {status}, a redirect to {response.headers.get('location', '')!r} (not followed)"
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPError) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text[:400], status


def _unexpected(data: bytes, what: str) -> Mismatch | Any:
    if not data.strip():
        return Mismatch(f"{what}: an empty body", f"{what}: a JSON object")
    try:
        return http.parse_json(data)
    except http.NotJson as exc:
        return Mismatch(f"{what}: {exc}", f"{what}: a JSON object")


def _chat(c: openai.OpenAI, model: str, messages: list[ChatCompletionMessageParam], **kwargs: Any) -> ChatObs:
    try:
        with c.chat.completions.with_streaming_response.create(model=model, messages=messages, **kwargs) as response:
            data = response.read()
    except (_openai().OpenAIError, httpx.HTTPError) as exc:
        error, status = _failure(exc)
        return ChatObs(error=error, status=status)
    value = _unexpected(data, "the chat completion")
    answer = value if isinstance(value, Mismatch) else fit(ChatCompletion, value, "the chat completion")
    if isinstance(answer, Mismatch):
        return ChatObs(status=200, unexpected=answer)
    choice = answer.choices[0]
    message = choice.message
    calls = tuple(ToolCallObs(t.function.name, t.function.arguments) for t in (message.tool_calls or []))
    return ChatObs(content=message.content, reasoning_content=message.reasoning_content, tool_calls=calls,
                   finish_reason=choice.finish_reason, status=200)


def plain(c: openai.OpenAI, model: str) -> ChatObs:
    return _chat(c, model, PLAIN, max_tokens=64, temperature=0)


def ready(c: openai.OpenAI, model: str) -> ChatObs:
    """The cutover's smoke test: the smallest request that proves the public port serves the model."""
    return _chat(c, model, READY, max_tokens=16, temperature=0)


def reasoning(c: openai.OpenAI, model: str) -> ChatObs:
    return _chat(c, model, THINK, max_tokens=1024, temperature=0,
                 extra_body={"chat_template_kwargs": {"thinking": True}})


def tools(c: openai.OpenAI, model: str) -> ChatObs:
    return _chat(c, model, TOOLS_PROMPT, tools=TOOLS, tool_choice="auto", max_tokens=512, temperature=0)


def _events(lines: Iterable[str]) -> Iterator[str]:
    """The data of each server-sent event (the OpenAI stream puts one JSON object on each `data:` line)."""
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield data


def stream(c: openai.OpenAI, model: str) -> StreamObs:
    chunks = content_chunks = reasoning_chunks = 0
    text, finish, usage = "", None, None
    try:
        with c.chat.completions.with_streaming_response.create(
                model=model, messages=PLAIN, max_tokens=64, temperature=0, stream=True,
                stream_options={"include_usage": True}) as response:
            for data in _events(response.iter_lines()):
                value = _unexpected(data.encode("utf-8", errors="surrogatepass"), f"stream chunk {chunks}")
                chunk = value if isinstance(value, Mismatch) else fit(ChatChunk, value, f"stream chunk {chunks}")
                if isinstance(chunk, Mismatch):
                    return StreamObs(chunks, content_chunks, text, reasoning_chunks, usage, finish, unexpected=chunk)
                chunks += 1
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
                for choice in chunk.choices:
                    if choice.delta.content:
                        content_chunks += 1
                        text += choice.delta.content
                    if choice.delta.reasoning_content:
                        reasoning_chunks += 1
                    if choice.finish_reason:
                        finish = choice.finish_reason
    except (_openai().OpenAIError, httpx.HTTPError) as exc:
        error, _ = _failure(exc)
        return StreamObs(chunks, content_chunks, text, reasoning_chunks, usage, finish, error)
    return StreamObs(chunks, content_chunks, text, reasoning_chunks, usage, finish)


def auth(base_url: str, model: str, api_key: str, timeout: float) -> AuthObs:
    """One request without a key and one with it, straight over HTTP so the status code is what the router said."""
    body = {"model": model, "messages": PLAIN, "max_tokens": 8}
    url = f"{base_url}/v1/chat/completions"
    try:
        with http.client(timeout, CHAT_MAX_BYTES) as bounded:
            without = http.read(bounded, "POST", url, CHAT_MAX_BYTES, json=body)[0].status_code
            with_key = http.read(bounded, "POST", url, CHAT_MAX_BYTES, json=body,
                                 headers={"Authorization": f"Bearer {api_key}"})[0].status_code
    except httpx.HTTPError as exc:
        return AuthObs(None, None, f"{type(exc).__name__}: {exc}")
    return AuthObs(without, with_key)
