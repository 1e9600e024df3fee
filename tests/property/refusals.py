"""What a refusal must look like: `check` exits 1 with at least one error that names the mutated field, by
its own field or, for a cross-field rule, in its message or fix; and the in-process loader agrees with a
ConfigError, never another exception."""

from __future__ import annotations

import re
from typing import Any

from tests.property.schema_fields import FieldCase

_INDEX = re.compile(r"\.(\d+)(?=\.|\[|$)")  # pydantic's prefill.gpus.0 is the tier's prefill.gpus[0]
_ANY_INDEX = re.compile(r"\[\d+\]")


def _canonical(field: str) -> str:
    return _INDEX.sub(r"[\1]", field)


def _related(problem_field: str, name: str) -> bool:
    """The same field, a list or table holding it (prefill.gpus for prefill.gpus[0], environment for one
    of its keys), or a part of it."""
    return problem_field == name or name.startswith((f"{problem_field}[", f"{problem_field}.")) or \
        problem_field.startswith((f"{name}[", f"{name}."))


def names_field(problem: dict[str, Any], case: FieldCase) -> bool:
    name = case.name
    field = _canonical(problem["field"])
    if _related(field, name):
        return True
    # Some problems name a server's field without its index (prefill.hosts for prefill[0].hosts[0]).
    if _related(_ANY_INDEX.sub("", field), _ANY_INDEX.sub("", name)):
        return True
    text = f"{problem['message']} {problem['fix']}"
    return name in text or _ANY_INDEX.sub("", name) in _ANY_INDEX.sub("", text)


def refusal_problems(report: dict[str, Any], case: FieldCase) -> str | None:
    """What is wrong with `check --json`'s report of a refused value (None: it names the field)."""
    errors = [p for p in report["problems"] if p["severity"] == "error"]
    if not errors:
        return "check said invalid without any error"
    if not any(names_field(p, case) for p in errors):
        return f"no error names {case.name}: {[(p['field'], p['message'][:120]) for p in errors][:5]}"
    return None
