"""A file whose fields fail: each field error as one problem, and the rest of the file made whole enough
to run the cross-field rules on it, so that a user fixes every problem in one pass.

The bad values are removed (defaults take their place) or, where a field is required, replaced: by the
reference profile's value, or for what the one-host reference has not (a placed server's hosts) by a
placeholder. A host's address needs neither: the model leaves it unset (schema.hosts.ADDRESS_UNSET) and the
host rules skip such a host. Every replaced field is named, and a rule problem that mentions one is
left out: it would be about pdserve's stand-in, not the user's value.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import tomllib
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from pdserve.schema.config import SHAPE_TAGS, WORKER_ROLES, Deployment
from pdserve.schema.problems import MISSING, MISSING_FIX, Problem, closest, did_you_mean

# The most passes of patching: a replaced value can fail a rule of its own type (a placeholder the
# schema later refuses), and each pass patches what the last one left failing.
MAX_PASSES = 4


# pydantic's own error types, worded by pdserve: (what is wrong, the fix). `{...}` take the error's context.
_KINDS: dict[str, tuple[str, str]] = {
    "int_type": ("is not a whole number", "write a whole number, without quotes, e.g. 4"),
    "int_parsing": ("is not a whole number", "write a whole number, without quotes, e.g. 4"),
    "int_from_float": ("is not a whole number", "write a whole number, without a fraction, e.g. 4"),
    "float_type": ("is not a number", "write a number, without quotes, e.g. 0.85"),
    "float_parsing": ("is not a number", "write a number, without quotes, e.g. 0.85"),
    "finite_number": ("is not a finite number", "write a finite number, e.g. 0.85"),
    "bool_type": ("is not true or false", "write true or false, without quotes"),
    "bool_parsing": ("is not true or false", "write true or false, without quotes"),
    "string_type": ("is not text", "write it as a quoted string"),
    "string_too_short": ("is shorter than {min_length} character(s)", "write at least {min_length} character(s)"),
    "string_too_long": ("is longer than {max_length} characters", "shorten it to {max_length} characters"),
    "string_pattern_mismatch": ("does not have the form this field takes ({pattern})", "write it in that form"),
    "list_type": ("is not a list", "write it as a list, e.g. [0, 1]"),
    "tuple_type": ("is not a list", "write it as a list, e.g. [0, 1]"),
    "set_type": ("is not a list", "write it as a list, e.g. [0, 1]"),
    "dict_type": ("is not a table", "write it as a table of keys and values"),
    "model_type": ("is not a table", "write it as a table of the fields `pdserve schema` lists for it"),
    "model_attributes_type": ("is not a table", "write it as a table of the fields `pdserve schema` lists for it"),
    "too_short": ("has fewer than {min_length} item(s)", "give at least {min_length}"),
    "too_long": ("has more than {max_length} items", "keep it to {max_length}"),
    "greater_than": ("is not above {gt}", "use a value above {gt}"),
    "greater_than_equal": ("is below {ge}", "use {ge} or more"),
    "less_than": ("is not below {lt}", "use a value below {lt}"),
    "less_than_equal": ("is above {le}", "use {le} or less"),
    "multiple_of": ("is not a multiple of {multiple_of}", "use a multiple of {multiple_of}"),
    "none_required": ("can only be left out here", "remove it"),
}
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


@functools.cache
def _schema() -> dict[str, Any]:
    return Deployment.model_json_schema()


def _alternatives(node: Any) -> list[dict[str, Any]]:
    """`node` with its $ref followed and its anyOf/oneOf/allOf spread: the shapes a value there may take."""
    found, stack, defs = [], [node], _schema().get("$defs", {})
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        if "$ref" in item:
            stack.append(defs.get(item["$ref"].rsplit("/", 1)[-1]))
        stack += [*item.get("anyOf", []), *item.get("oneOf", []), *item.get("allOf", [])]
        found.append(item)
    return found


def known_keys(loc: tuple[Any, ...]) -> set[str]:
    """The field names the table at data location `loc` takes (empty when the schema does not say)."""
    nodes: list[Any] = [_schema()]
    for part in loc:
        step = []
        for node in (n for item in nodes for n in _alternatives(item)):
            if isinstance(part, int):
                step.append(node.get("items"))
            elif part in node.get("properties", {}):
                step.append(node["properties"][part])
            elif isinstance(node.get("additionalProperties"), dict):
                step.append(node["additionalProperties"])
        nodes = step
    return {key for node in nodes for n in _alternatives(node) for key in n.get("properties", {})}


def _section(loc: tuple[Any, ...]) -> str:
    return f"[{field_of(loc)}]" if loc else "the top level"


def _worded(error: ErrorDetails, loc: tuple[Any, ...], field: str) -> tuple[str, str]:
    """(message, fix) of one validation error, in pdserve's words: pydantic's phrases never reach a user."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if "fix" in ctx:  # pdserve's own validators (schema.fields.invalid) word their errors themselves
        return error["msg"], str(ctx["fix"])
    if kind == "missing":
        return MISSING, MISSING_FIX
    if kind == "extra_forbidden":
        known = known_keys(loc[:-1])
        return (f"is not a field of {_section(loc[:-1])}",
                f"{did_you_mean(loc[-1], known)}remove it or correct its spelling; the fields there: "
                f"{', '.join(sorted(known)) or 'see `pdserve schema`'}")
    if kind in {"literal_error", "enum"}:
        options = _QUOTED.findall(str(ctx.get("expected", "")))
        return ("is not one of the values this field takes",
                f"{did_you_mean(error.get('input'), options)}use one of: {', '.join(options)}")
    if kind == "value_error":  # a plain ValueError of a validator: its own text, without pydantic's prefix
        return str(error["msg"]).removeprefix("Value error, "), "see `pdserve schema` for this field"
    if kind in _KINDS:
        message, fix = _KINDS[kind]
        if kind in {"greater_than", "less_than"} and "fraction" in field:
            fix = "use a fraction strictly between 0 and 1, e.g. 0.85"
        return message.format_map(_Context(ctx)), fix.format_map(_Context(ctx))
    return "is not a value this field takes", "see `pdserve schema` for what it takes"


class _Context(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "the limit"


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


def field_of(loc: tuple[Any, ...]) -> str:
    """A data location as problems name it: prefill[0].port for the servers of a multi-host file."""
    field = ""
    for part in loc:
        placed = isinstance(part, int) and field in WORKER_ROLES
        field = f"{field}[{part}]" if placed else field_name(field, part)
    return field or "(deployment)"


def meant_fields(exc: ValidationError) -> set[str]:
    """The fields that misspelled keys most likely meant (model.context_lenght: model.context_length). Such a
    field's "is required and missing" is the misspelling's second error, not a cause of its own."""
    meant = set()
    for error in exc.errors(include_url=False):
        loc = data_location(error["loc"])
        if error["type"] == "extra_forbidden" and loc:
            near = closest(loc[-1], known_keys(loc[:-1]))
            if near:
                meant.add(field_of((*loc[:-1], near)))
    return meant


def problems_from_validation(exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = data_location(error["loc"])
        field = field_of(loc)
        value = None if error["type"] == "missing" else error.get("input")
        problems.append(Problem(field, value, *_worded(error, loc, field)))
    return problems


def _cut(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of the document to replace for an error at `loc`: the field itself, inside a table of an
    array too (prefill[0].port); but a bad item of an array of scalars (gpus[1]) replaces the array."""
    node = data
    for i, part in enumerate(loc):
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
            if not isinstance(item, dict) or i == len(loc) - 1:
                return loc[:i]
            node = item
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return loc


def _reference_value(reference: dict[str, Any], loc: tuple[Any, ...]) -> tuple[bool, Any]:
    """(found, value) of the reference profile at `loc`: its one [prefill] table stands for every
    [[prefill]] server; it has no [hosts]."""
    node: Any = reference
    for part in loc:
        if isinstance(part, int):
            continue
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, copy.deepcopy(node)


def _placeholder(data: dict[str, Any], loc: tuple[Any, ...]) -> tuple[bool, Any]:
    """A stand-in for a required field of the multi-host shape, which the reference profile lacks."""
    if len(loc) == 3 and loc[0] in WORKER_ROLES and isinstance(loc[1], int) and loc[2] == "hosts":
        hosts = data.get("hosts")
        names = [name for name in hosts if isinstance(name, str)] if isinstance(hosts, dict) else []
        return (True, names[:1]) if names else (False, None)
    return False, None


def _container(root: Any, loc: tuple[Any, ...]) -> dict[str, Any] | None:
    """The table that holds `loc`'s last part, made where a bad value of another type stood."""
    node = root
    for part in loc[:-1]:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and -len(node) <= part < len(node) else None
        elif isinstance(node, dict):
            if not isinstance(node.get(part), dict | list):
                node[part] = {}
            node = node[part]
        else:
            return None
    return node if isinstance(node, dict) else None


def patched(data: dict[str, Any], locations: list[tuple[Any, ...]], reference_text: str,
            revalidate: Callable[[dict[str, Any]], list[tuple[Any, ...]]]) -> tuple[dict[str, Any] | None, set[str]]:
    """`data` with the values at `locations` removed, required ones replaced (see the module's docstring),
    and the names of the fields that no longer hold the user's value. `revalidate` gives the data locations
    that still fail; the data is None when they do after MAX_PASSES."""
    reference = tomllib.loads(reference_text)
    result = copy.deepcopy(data)
    replaced: set[str] = set()
    for _ in range(MAX_PASSES):
        cuts = list(dict.fromkeys(_cut(result, loc) for loc in locations))
        for loc in cuts:
            holder = _container(result, loc) if loc else None
            if holder is None:
                continue
            holder.pop(loc[-1], None)
            found, value = _reference_value(reference, loc)
            if not found:
                found, value = _placeholder(result, loc)
            if found:
                holder[loc[-1]] = value
            replaced.add(field_of(loc))
        locations = revalidate(result)
        if not locations:
            return result, replaced
        if not cuts:
            break
    return None, replaced


def within(field: str, container: str) -> bool:
    return field == container or field.startswith((f"{container}.", f"{container}["))


# A word of a problem line as a whole: a dotted field path, or a flag such as --served-model-name.
_WORD = re.compile(r"[\w.\[\]-]+")


def _as_field(word: str) -> str:
    """A word as a field path: `[hosts.gpu-a]` (a table header in prose) is hosts.gpu-a."""
    word = word.rstrip(".,;:")
    if word.startswith("[") and word.endswith("]") and word.count("[") == 1:
        return word[1:-1]
    return word


def mentions(problem: Problem, fields: set[str]) -> bool:
    """Whether a rule's problem depends on one of `fields` (or a part of one): its own field, or a field
    path its message or fix names as a whole word (`name` must not match `served_model_name`). In the
    prose only paths (`model.context_length`) and snake_case names (`allow_shared_gpus`) count: a bare
    English word such as "model" in "anyone ... can use the model" names no field."""
    words = [word.rstrip(".,;:") for word in _WORD.findall(f"{problem.message} {problem.fix}")]
    tokens = [problem.field, *(_as_field(w) for w in words if "." in w or "[" in w or "_" in w)]
    return any(within(token, field) for token in tokens for field in fields if field)
