"""The deployment's `model` section: what is served, and the parser names the pinned SGLang accepts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pdserve.schema import pins
from pdserve.schema.fields import Count, dotted_path_problem, invalid
from pdserve.schema.problems import did_you_mean


class ModelSpec(BaseModel):
    """What is served. Parsers go on both SGLang servers, never on the router."""

    # As every section of the deployment (pdserve.schema.config._Section): no coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    path: str = Field(description="Model directory (absolute) or a Hugging Face repository id")
    served_name: str | None = Field(None, description="Name clients send as `model`; defaults to the path")
    reasoning_parser: str | None = Field(None, description="SGLang --reasoning-parser, e.g. deepseek-v4")
    tool_call_parser: str | None = Field(None, description="SGLang --tool-call-parser, e.g. deepseekv4")
    chat_template: str | None = Field(None, description="SGLang --chat-template (a name or an absolute path)")
    context_length: Count | None = Field(None, description="--context-length; unset keeps the model's own")
    kv_cache_dtype: str = Field("auto", description="--kv-cache-dtype")
    trust_remote_code: bool = False

    @field_validator("path")
    @classmethod
    def _path_not_relative(cls, value: str) -> str:
        if value.startswith((".", "~")):
            raise invalid(
                "a relative model path resolves against the unit's working directory (/)",
                "write the absolute path of the model directory",
            )
        return _plain_if_absolute(value, "/var/lib/models/DeepSeek-V4-Flash-NVFP4")

    @field_validator("chat_template")
    @classmethod
    def _template_path_plain(cls, value: str | None) -> str | None:
        return None if value is None else _plain_if_absolute(value, "/etc/pdserve/chat-template.jinja")

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        return _known(value, pins.REASONING_PARSERS, "reasoning parser")

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_call_parser(cls, value: str | None) -> str | None:
        return _known(value, pins.TOOL_CALL_PARSERS, "tool-call parser")


def _plain_if_absolute(value: str, example: str) -> str:
    """An absolute path as the units' sandbox check (pdserve.render.reach) and SGLang will both read it."""
    problem = dotted_path_problem(value) if value.startswith("/") else None
    if problem:
        raise invalid(problem, f"write the plain absolute path, e.g. {example}")
    return value


def _known(value: str | None, names: frozenset[str], what: str) -> str | None:
    if value is None or value in names:
        return value
    raise invalid(
        f"not a {what} of sglang {pins.SGLANG_VERSION}",
        f"{did_you_mean(value, names)}use one of: {', '.join(sorted(names))}",
    )
