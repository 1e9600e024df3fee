"""Reading a deployment from TOML, JSON or the embedded default profile, with every problem at once."""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdserve.config import Deployment
from pdserve.problems import ConfigError, Problem, errors
from pdserve.rules import validate

DEFAULT_PROFILE = "dsv4.toml"


@dataclass(frozen=True)
class Loaded:
    deployment: Deployment
    source: str
    warnings: list[Problem]


def default_profile_text() -> str:
    return resources.files("pdserve.profiles").joinpath(DEFAULT_PROFILE).read_text(encoding="utf-8")


def parse_document(text: str, fmt: str, source: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError([Problem("(file)", source, f"is not valid {fmt.upper()}: {exc}", f"fix the {fmt.upper()} syntax")], source) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem("(file)", source, "does not hold a table/object", "write the deployment as a table")], source)
    return data


def _fix_for(error: dict[str, Any], field: str) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if "fix" in ctx:
        return str(ctx["fix"])
    if kind == "missing":
        return "add this field (see `pdserve schema`)"
    if kind == "extra_forbidden":
        return "remove it or correct its spelling (see `pdserve schema` for the known fields)"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected', 'the listed values')}"
    if kind in {"greater_than", "less_than", "greater_than_equal", "less_than_equal"}:
        if "fraction" in field:
            return "use a fraction strictly between 0 and 1, e.g. 0.85"
        return "use a value inside the allowed range shown in the message"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return "use a value of the type shown in the message"
    return "see `pdserve schema` for this field"


def problems_from_validation(exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"]) or "(deployment)"
        value = None if error["type"] == "missing" else error.get("input")
        problems.append(Problem(field, value, error["msg"], _fix_for(error, field)))
    return problems


def _without(data: dict[str, Any], locations: list[tuple[Any, ...]]) -> dict[str, Any]:
    """A copy of `data` with the values at `locations` removed (a bad list item removes its list)."""
    pruned = copy.deepcopy(data)
    for loc in locations:
        loc = loc[: next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))]
        parent = pruned
        for part in loc[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and loc:
            parent.pop(loc[-1], None)
    return pruned


def deployment_from_data(data: dict[str, Any], source: str) -> Loaded:
    try:
        deployment = Deployment.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc)
        # Report the cross-field rules too, so a user fixes everything in one pass: drop the bad
        # values (defaults take their place) and run the rules on what is left, if that validates.
        try:
            rest = Deployment.model_validate(_without(data, [e["loc"] for e in exc.errors()]))
        except ValidationError:
            raise ConfigError(problems, source) from None
        bad = {p.field for p in problems}
        problems += [p for p in validate(rest) if p.field not in bad]
        raise ConfigError(problems, source) from None
    problems = validate(deployment)
    if errors(problems):
        raise ConfigError(problems, source)
    return Loaded(deployment, source, problems)


def load(path: Path | None = None) -> Loaded:
    """Load and validate a deployment; with no path, the embedded reference profile."""
    if path is None:
        return deployment_from_data(parse_document(default_profile_text(), "toml", "<default profile>"), "<default profile>")
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in {".toml", ".json"}:
        raise ConfigError([Problem("(file)", source, "has an unknown extension", "name the file *.toml or *.json")], source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem("(file)", source, f"cannot be read: {exc.strerror}", "check the path and its permissions")], source) from None
    return deployment_from_data(parse_document(text, suffix[1:], source), source)


def json_schema() -> dict[str, Any]:
    schema = Deployment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "pdserve deployment"
    return schema
