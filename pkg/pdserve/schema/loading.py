"""Reading a deployment from TOML, JSON or the embedded default profile, with every problem at once."""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdserve.schema import rules_hosts, rules_ports
from pdserve.schema.config import SHAPE_TAGS, WORKER_ROLES, Deployment
from pdserve.schema.problems import ConfigError, Problem, errors
from pdserve.schema.rules import RULES, Rule, validate
from pdserve.schema.systemd_syntax import TEXT_FIX, text_problem

DEFAULT_PROFILE = "dsv4.toml"
# A deployment is a few KiB; anything this large is the wrong file (or an attempt to exhaust memory).
MAX_FILE_BYTES = 4 * 1024 * 1024
# The schema is 3 levels deep; deeper documents are not deployments, and parsers recurse per level.
MAX_DEPTH = 16


@dataclass(frozen=True)
class Loaded:
    deployment: Deployment
    source: str
    warnings: list[Problem]


def default_profile_text() -> str:
    return resources.files("pdserve.schema.profiles").joinpath(DEFAULT_PROFILE).read_text(encoding="utf-8")


def _file_problem(source: str, message: str, fix: str) -> ConfigError:
    return ConfigError([Problem("(file)", source, message, fix)], source)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON objects with a repeated key are refused, as TOML refuses a repeated key."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key!r} appears twice in one object")
        data[key] = value
    return data


def _depth(data: Any) -> int:
    """How deeply tables/arrays nest (iteratively: the point is to refuse a bomb before recursing)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            if deepest > MAX_DEPTH:
                break
            stack += [(child, level + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def parse_document(text: str, fmt: str, source: str) -> dict[str, Any]:
    name = fmt.upper()
    try:
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text, object_pairs_hook=_unique_keys)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, repeated keys and integers over Python's digit limit.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, RecursionError):
            detail = f"it nests tables/arrays deeper than the parser can follow (a deployment has {MAX_DEPTH} at most)"
        raise _file_problem(source, f"is not valid {name}: {detail}", f"fix the {name} syntax") from None
    if not isinstance(data, dict):
        raise _file_problem(source, "does not hold a table/object", "write the deployment as a table")
    if _depth(data) > MAX_DEPTH:
        raise _file_problem(source, f"nests tables/arrays more than {MAX_DEPTH} levels deep, unlike any deployment",
                            "write the deployment's tables as `pdserve schema` describes them")
    return data


def _text_problems(data: Any, path: str = "") -> list[Problem]:
    """Every string in the document, keys included, that systemd could not carry exactly: found on the
    raw data so that no field, known or unknown, is missed."""
    problems: list[Problem] = []
    if isinstance(data, str):
        message = text_problem(data)
        if message:
            problems.append(Problem(path or "(deployment)", data, message, TEXT_FIX))
    elif isinstance(data, dict):
        for key, value in data.items():
            here = field_name(path, key)
            message = text_problem(key) if isinstance(key, str) else None
            if message:
                problems.append(Problem(here, key, f"(the key) {message}", TEXT_FIX))
            problems += _text_problems(value, here)
    elif isinstance(data, list):
        for item in data:
            problems += _text_problems(item, path)
    return problems


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


def field_name(path: str, key: Any) -> str:
    """`path.key`, with a key that is not a plain name written as a JSON string (`env["A B"]`), so a
    hostile key cannot break the one-line problem format."""
    if isinstance(key, str) and not _PLAIN_KEY.fullmatch(key):
        return f"{path}[{json.dumps(key)}]"
    return f"{path}.{key}" if path else str(key)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def data_location(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Where an error is in the document: without the shape tag that `prefill`/`decode` carry in pydantic's
    location (a table or an array of servers, pdserve.schema.config.RoleServers), and a bad key's location
    as the entry it names."""
    if loc and loc[-1] == "[key]":  # a bad key of a table (a host's name): the entry it names
        loc = loc[:-1]
    if len(loc) > 1 and loc[0] in WORKER_ROLES and loc[1] in SHAPE_TAGS:
        return (loc[0], *loc[2:])
    return tuple(loc)


def problems_from_validation(exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        field = ""
        for part in data_location(error["loc"]):
            # The servers of a multi-host file as the rules name them: prefill[0].port.
            placed = isinstance(part, int) and field in WORKER_ROLES
            field = f"{field}[{part}]" if placed else field_name(field, part)
        field = field or "(deployment)"
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


def _reference() -> dict[str, Any]:
    return tomllib.loads(default_profile_text())


def _patched(data: dict[str, Any], locations: list[tuple[Any, ...]]) -> tuple[dict[str, Any], set[str]]:
    """`data` without the values at `locations`, each replaced by the reference profile's value where
    the field is required (so one bad required field does not hide every cross-field rule). Returns the
    patched data and the dotted names of the fields that no longer hold the user's value."""
    pruned = _without(data, locations)
    reference = _reference()
    replaced: set[str] = set()
    for loc in locations:
        loc = tuple(loc[: next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))])
        replaced.add(".".join(str(p) for p in loc))
        source: Any = reference
        target: Any = pruned
        for part in loc[:-1]:
            source = source.get(part) if isinstance(source, dict) else None
            if isinstance(target, dict) and not isinstance(target.get(part), dict):
                target[part] = {}
            target = target.get(part) if isinstance(target, dict) else None
        if loc and isinstance(source, dict) and loc[-1] in source and isinstance(target, dict):
            target.setdefault(loc[-1], copy.deepcopy(source[loc[-1]]))
    return pruned, replaced


def _within(field: str, container: str) -> bool:
    return field == container or field.startswith((f"{container}.", f"{container}["))


# A word of a problem line as a whole: a dotted field path, or a flag such as --served-model-name.
_WORD = re.compile(r"[\w.\[\]-]+")


def _mentions(problem: Problem, fields: set[str]) -> bool:
    """Whether a rule's problem depends on one of `fields` (or a part of one): its own field, or a field
    path its message or fix names as a whole word (`name` must not match `served_model_name`). In the
    prose only paths (`model.context_length`) and snake_case names (`allow_shared_gpus`) count: a bare
    English word such as "model" in "anyone ... can use the model" names no field."""
    words = [word.rstrip(".") for word in _WORD.findall(f"{problem.message} {problem.fix}")]
    tokens = [problem.field, *(w for w in words if "." in w or "[" in w or "_" in w)]
    return any(_within(token, field) for token in tokens for field in fields if field)


def deployment_from_data(data: dict[str, Any], source: str, extra_rules: Sequence[Rule] = ()) -> Loaded:
    """Validate a parsed document: fields, then the cross-field rules and `extra_rules` (the render
    layer's, see pdserve.render.renderable), every problem at once."""
    # The hosts' rules first: a file of the wrong shape is told so before what follows from it.
    rules = (*rules_hosts.RULES, *RULES, *rules_ports.RULES, *extra_rules)
    text_problems = _text_problems(data)
    try:
        deployment = Deployment.model_validate(data)
    except ValidationError as exc:
        # A field with a control character also fails its own pattern: say the first thing only.
        problems = text_problems + [p for p in problems_from_validation(exc)
                                    if not any(_within(t.field, p.field) for t in text_problems)]
        # Report the cross-field rules too, so a user fixes everything in one pass: replace the bad
        # values (by defaults, or the reference's value for a required field) and run the rules on the
        # rest, leaving out what a replaced value took part in.
        patched, replaced = _patched(data, [data_location(e["loc"]) for e in exc.errors()])
        try:
            rest = Deployment.model_validate(patched)
        except ValidationError:
            raise ConfigError(problems, source) from None
        bad = {p.field for p in problems}
        problems += [p for p in validate(rest, rules) if p.field not in bad and not _mentions(p, replaced)]
        raise ConfigError(problems, source) from None
    problems = validate(deployment, rules)
    if text_problems:
        bad = {p.field for p in text_problems}
        raise ConfigError(text_problems + [p for p in problems if p.field not in bad], source)
    if errors(problems):
        raise ConfigError(problems, source)
    return Loaded(deployment, source, problems)


def load(path: Path | None = None, extra_rules: Sequence[Rule] = ()) -> Loaded:
    """Load and validate a deployment; with no path, the embedded reference profile."""
    if path is None:
        data = parse_document(default_profile_text(), "toml", "<default profile>")
        return deployment_from_data(data, "<default profile>", extra_rules)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in {".toml", ".json"}:
        raise ConfigError([Problem("(file)", source, "has an unknown extension", "name the file *.toml or *.json")], source)
    return deployment_from_data(parse_document(read_text(path), suffix[1:], source), source, extra_rules)


def read_text(path: Path) -> str:
    """The file's text, or one ConfigError line: unreadable, not a regular file, too large, not UTF-8."""
    source = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not hang; fstat then refuses anything but a regular file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _file_problem(source, f"cannot be read: {exc.strerror}", "check the path and its permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _file_problem(source, "is not a regular file", "point --config at a deployment file")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise _file_problem(source, f"cannot be read: {exc.strerror}", "check the path and its permissions") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _file_problem(source, f"is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB, far beyond any deployment",
                            "point --config at the deployment file")
    if b"\0" in raw:
        raise _file_problem(source, "holds NUL bytes: it is a binary file, not a deployment",
                            "point --config at the deployment file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _file_problem(source, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                            "save the file as UTF-8") from None


def json_schema() -> dict[str, Any]:
    schema = Deployment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "pdserve deployment"
    return schema
