"""End-to-end requests through the router with the official openai client."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    import openai

from pdserve.probes.observations import AuthObs, ChatObs, StreamObs, ToolCallObs

PLAIN = [{"role": "user", "content": "Say hello in one short sentence."}]
READY = [{"role": "user", "content": "Reply with the single word: ready"}]
THINK = [{"role": "user", "content": "What is 17 + 25? Think it through, then answer with the number."}]
TOOLS_PROMPT = [{"role": "user", "content": "Use both tools: get the weather in Paris and the local time in Tokyo."}]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]


def _openai():
    # The client library takes most of a second to import; only the end-to-end checks need it, so
    # every other pdserve command (the units' readiness gates among them) starts without it.
    import openai

    return openai


def client(base_url: str, api_key: str | None, timeout: float) -> openai.OpenAI:
    # The client needs some key; a router without --api-key ignores it.
    return _openai().OpenAI(base_url=f"{base_url}/v1", api_key=api_key or "none", timeout=timeout, max_retries=0)


def _failure(exc: Exception) -> tuple[str, int | None]:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}: {exc}"[:400], status


def _chat(c: openai.OpenAI, model: str, messages, **kwargs) -> ChatObs:
    try:
        response = c.chat.completions.create(model=model, messages=messages, **kwargs)
    except _openai().OpenAIError as exc:
        error, status = _failure(exc)
        return ChatObs(error=error, status=status)
    if not response.choices:
        return ChatObs(status=200)  # an answer without a choice: no text, which the caller judges
    choice = response.choices[0]
    message = choice.message
    calls = tuple(ToolCallObs(t.function.name, t.function.arguments) for t in (message.tool_calls or []))
    return ChatObs(
        content=message.content,
        reasoning_content=getattr(message, "reasoning_content", None),
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        status=200,
    )


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


def stream(c: openai.OpenAI, model: str) -> StreamObs:
    chunks = content_chunks = reasoning_chunks = 0
    text, finish, usage = "", None, None
    try:
        events = c.chat.completions.create(model=model, messages=PLAIN, max_tokens=64, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        for chunk in events:
            chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    content_chunks += 1
                    text += delta.content
                if getattr(delta, "reasoning_content", None):
                    reasoning_chunks += 1
                if choice.finish_reason:
                    finish = choice.finish_reason
    except _openai().OpenAIError as exc:
        error, _ = _failure(exc)
        return StreamObs(chunks, content_chunks, text, reasoning_chunks, usage, finish, error)
    return StreamObs(chunks, content_chunks, text, reasoning_chunks, usage, finish)


def auth(base_url: str, model: str, api_key: str, timeout: float) -> AuthObs:
    """One request without a key and one with it, straight over HTTP so the status code is what the router said."""
    body = {"model": model, "messages": PLAIN, "max_tokens": 8}
    url = f"{base_url}/v1/chat/completions"
    try:
        with httpx.Client(timeout=timeout) as http:
            without = http.post(url, json=body).status_code
            with_key = http.post(url, json=body, headers={"Authorization": f"Bearer {api_key}"}).status_code
    except httpx.HTTPError as exc:
        return AuthObs(None, None, f"{type(exc).__name__}: {exc}")
    return AuthObs(without, with_key)
