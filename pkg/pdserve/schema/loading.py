"""Reading a deployment from TOML, JSON or the embedded default profile, with every problem at once."""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdserve.schema import field_errors, rules_hosts, rules_ports, rules_router
from pdserve.schema.config import Deployment
from pdserve.schema.field_errors import field_name
from pdserve.schema.problems import MISSING, ConfigError, Problem, errors
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


def _file_problem(source: str, message: str, fix: str, step: str = "reading the file") -> ConfigError:
    """The one problem of a file that stopped the check at `step`, which the report names as what it checked."""
    return ConfigError([Problem("(file)", source, message, fix)], source,
                       [f"{step}, which failed: no field was reached"])


class RepeatedKey(ValueError):
    """A JSON object names one key twice."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: JSON objects with a repeated key are refused (RepeatedKey), as TOML
    refuses a repeated key; Python's json alone keeps the last value silently."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise RepeatedKey(f"key {key!r} appears twice in one object")
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
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text, object_pairs_hook=unique_keys)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, repeated keys and integers over Python's digit limit.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, RecursionError):
            detail = f"it nests tables/arrays deeper than the parser can follow (a deployment has {MAX_DEPTH} at most)"
        raise _file_problem(source, f"is not valid {name}: {detail}", f"fix the {name} syntax",
                            f"the {name} syntax") from None
    if not isinstance(data, dict):
        raise _file_problem(source, "does not hold a table/object", "write the deployment as a table",
                            f"the {name} syntax and the document's shape")
    if _depth(data) > MAX_DEPTH:
        raise _file_problem(source, f"nests tables/arrays more than {MAX_DEPTH} levels deep, unlike any deployment",
                            "write the deployment's tables as `pdserve schema` describes them",
                            f"the {name} syntax and the document's shape")
    return data


def _leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any, bool]]:
    """(field, value, whether it is a key) of every key and scalar in the document, named as problems name
    them: a table inside an array by its index (prefill[0].port), an array's scalars by the array."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = field_name(path, key)
            yield here, key, True
            yield from _leaves(value, here)
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from _leaves(item, f"{path}[{index}]" if isinstance(item, dict) else path)
    else:
        yield path or "(deployment)", data, False


def _raw_problems(data: Any) -> list[Problem]:
    """Found on the raw data, so that no field, known or unknown, is missed: every string, keys included,
    that systemd could not carry exactly, and every number that is not finite (TOML's nan and inf, JSON's
    NaN and a 1e999 that overflows), which no field takes and no JSON output may echo as a number."""
    problems: list[Problem] = []
    for field, value, is_key in _leaves(data):
        if isinstance(value, str):
            message = text_problem(value)
            if message:
                problems.append(Problem(field, value, f"(the key) {message}" if is_key else message, TEXT_FIX))
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(Problem(field, value, f"is not a finite number ({value})",
                                    "write a finite number inside the field's range (see `pdserve schema`)"))
    return problems


# What `pdserve check` says it checked (pdserve.check.run): every field and rule, or, when fields fail,
# the fields and the rules that could run without them.
CHECKED_ALL = "schema and field rules"
CHECKED_REST = "schema and field rules (the cross-field rules without the fields in error)"
CHECKED_FIELDS = "field types and bounds"
SKIPPED_RULES = "cross-field rules: the fields in error leave too little of the file to run them on"
SKIPPED_SHAPE = "cross-field rules: [hosts] is not a table of hosts, so which layout the file describes is unknown"


def deployment_from_data(data: dict[str, Any], source: str, extra_rules: Sequence[Rule] = ()) -> Loaded:
    """Validate a parsed document: fields, then the cross-field rules and `extra_rules` (the render
    layer's, see pdserve.render.renderable), every problem at once."""
    # The hosts' rules first: a file of the wrong shape is told so before what follows from it.
    rules = (*rules_hosts.RULES, *RULES, *rules_router.RULES, *rules_ports.RULES, *extra_rules)
    raw_problems = _raw_problems(data)
    try:
        deployment = Deployment.model_validate(data)
    except ValidationError as exc:
        # A field with a control character also fails its own pattern: say the first thing only. A misspelled
        # key leaves the field it meant missing: one cause, so one problem (the misspelling's, which names it).
        meant = field_errors.meant_fields(exc)
        problems = raw_problems + [p for p in field_errors.problems_from_validation(exc)
                                   if not any(field_errors.within(t.field, p.field) for t in raw_problems)
                                   and not (p.field in meant and p.message == MISSING)]
        # Report the cross-field rules too, so a user fixes everything in one pass: replace the bad
        # values and run the rules on the rest, leaving out what a replaced value took part in.
        rest, replaced = field_errors.patched(data, [field_errors.data_location(e["loc"]) for e in exc.errors()],
                                              default_profile_text(), _failing)
        if rest is None:
            raise ConfigError(problems, source, [CHECKED_FIELDS], [SKIPPED_RULES]) from None
        if "hosts" in replaced:
            # Without its [hosts] the file has another shape (one host), and every rule would judge that one.
            raise ConfigError(problems, source, [CHECKED_FIELDS], [SKIPPED_SHAPE]) from None
        bad = {p.field for p in problems}
        problems += [p for p in validate(Deployment.model_validate(rest), rules)
                     if p.field not in bad and not field_errors.mentions(p, replaced)
                     and not (p.field in meant and p.message == MISSING)]
        raise ConfigError(problems, source, [CHECKED_REST]) from None
    problems = validate(deployment, rules)
    if raw_problems:
        bad = {p.field for p in raw_problems}
        raise ConfigError(raw_problems + [p for p in problems if p.field not in bad], source, [CHECKED_ALL])
    if errors(problems):
        raise ConfigError(problems, source, [CHECKED_ALL])
    return Loaded(deployment, source, problems)


def _failing(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The data locations of `data` that fail validation; none when it validates."""
    try:
        Deployment.model_validate(data)
    except ValidationError as exc:
        return [field_errors.data_location(e["loc"]) for e in exc.errors()]
    return []


def load(path: Path | None = None, extra_rules: Sequence[Rule] = ()) -> Loaded:
    """Load and validate a deployment; with no path, the embedded reference profile."""
    if path is None:
        data = parse_document(default_profile_text(), "toml", "<default profile>")
        return deployment_from_data(data, "<default profile>", extra_rules)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in {".toml", ".json"}:
        raise _file_problem(source, "has an unknown extension", "name the file *.toml or *.json", "the file's name")
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
            raise _file_problem(source, f"cannot be read: {exc.strerror}",
                                "check the path and its permissions") from None
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
