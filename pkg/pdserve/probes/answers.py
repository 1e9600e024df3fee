"""The typed shapes of the answers pdserve reads, and the one way an answer is checked against its shape.

Each model names only the fields pdserve reads, with strict types (no bool for an int, no string for a
number, finite floats, integers in range); other fields are ignored. An answer that does not fit becomes a
Mismatch: where, what came back, what should have; the checks put those in their observed and expected
values. The chat shapes follow the OpenAI chat completions API (pdserve.probes.chat reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Port = Annotated[int, Field(ge=0, le=65535)]
SHOWN = 80  # characters of an odd value shown in a Mismatch


class Shape(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


@dataclass(frozen=True)
class Mismatch:
    """An answer that is not what its API says: `observed` names what came back, `expected` what should have."""

    observed: str
    expected: str

    def __str__(self) -> str:
        return f"{self.observed}; expected {self.expected}"


def shown(value: object) -> str:
    """A value as a short, printable text, with its JSON type."""
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{text[:SHOWN]}{'...' if len(text) > SHOWN else ''} ({kind})"


M = TypeVar("M", bound=Shape)

# pydantic's error types, as what the field should have been.
_WANTED = {"model_type": "an object", "dict_type": "an object", "list_type": "a list", "int_type": "an integer",
           "string_type": "a string", "float_type": "a number", "bool_type": "a boolean",
           "too_short": "a non-empty list", "finite_number": "a finite number",
           "literal_error": "one of the values the API names"}


def fit(model: type[M], value: Any, what: str) -> M | Mismatch:
    """`value` (parsed JSON) as `model`, or the first way it differs, named from `what` (e.g. '/server_info')."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        path = ".".join(str(p) for p in error["loc"])
        where = f"{what} {path}" if path else what
        if error["type"] == "missing":
            return Mismatch(f"{where}: missing", f"{where}: present")
        wanted = _WANTED.get(error["type"]) or error["msg"][:1].lower() + error["msg"][1:]
        return Mismatch(f"{where} = {shown(error['input'])}", f"{where}: {wanted}")


# ---- SGLang's workers: /server_info read by three checks, each for its own fields
class Capacity(Shape):
    """/server_info's KV capacity, in the releases that report it there."""
    max_total_num_tokens: Count | None = None


class ModelInfo(Shape):
    """/model_info: the mode and parsers the server runs. /server_info reports them too (ServerArgs), for
    the releases whose /model_info lacks one; where /model_info has it, its value is the one read."""
    disaggregation_mode: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None


class ServerArgs(ModelInfo):
    """/server_info: the server's resolved arguments, /model_info's among them."""
    tp_size: Count | None = None
    mem_fraction_static: float | None = None
    context_length: Count | None = None
    chunked_prefill_size: Annotated[int, Field(ge=-1, le=2**63 - 1)] | None = None  # -1: chunking off


class Version(Shape):
    version: str | None = None


# ---- the router (smg)
class Readiness(Shape):
    """/readiness: smg answers 503 with only status and reason ("insufficient healthy workers", "draining")."""
    healthy_workers: Count | None = None
    total_workers: Count | None = None
    status: str | None = None
    reason: str | None = None


class Worker(Shape):
    url: str
    worker_type: str | None = None
    bootstrap_port: Port | None = None
    is_healthy: bool = False


class Workers(Shape):
    workers: list[Worker] = []


# ---- the OpenAI chat completions API
class Function(Shape):
    name: str
    arguments: str  # a JSON text, as the API says


class ToolCall(Shape):
    type: Literal["function"] = "function"
    function: Function


class Message(Shape):
    content: str | None = None
    reasoning_content: str | None = None  # SGLang's addition, filled by its reasoning parser
    tool_calls: list[ToolCall] | None = None


class Choice(Shape):
    message: Message
    finish_reason: str | None = None


class Usage(Shape):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count


class ChatCompletion(Shape):
    choices: Annotated[list[Choice], Field(min_length=1)]
    usage: Usage | None = None


class DeltaFunction(Shape):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(Shape):
    index: Count
    function: DeltaFunction | None = None


class Delta(Shape):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(Shape):
    delta: Delta
    finish_reason: str | None = None


class ChatChunk(Shape):
    choices: list[ChunkChoice]
    usage: Usage | None = None
