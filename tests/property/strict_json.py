"""A strict JSON reader, as a consumer other than Python's lenient one would read pdserve's JSON: no NaN or
Infinity (not JSON, RFC 8259 section 6), no repeated keys, and no lone surrogate escapes (I-JSON, RFC 7493
section 2.1: strict parsers such as serde_json refuse them, others replace them silently)."""

from __future__ import annotations

import json
from typing import Any

from pdserve.schema.loading import RepeatedKey, unique_keys


class NotStrictJson(AssertionError):
    pass


def _constant(name: str) -> Any:
    raise NotStrictJson(f"{name} is not JSON (RFC 8259 allows no NaN or Infinity)")


def _lone_surrogate(data: Any) -> str | None:
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in item):
                return item
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return None


def strict_loads(text: str, what: str) -> Any:
    try:
        # Repeated keys are refused as pdserve refuses them in a deployment file: a reader, not the writer
        # under test (pdserve.schema.strict_json); test_consumers_can_fail holds that it refuses them.
        data = json.loads(text, parse_constant=_constant, object_pairs_hook=unique_keys)
    except (NotStrictJson, RepeatedKey) as exc:
        raise NotStrictJson(f"{what} is not strict JSON: {exc}") from None
    except ValueError as exc:
        raise NotStrictJson(f"{what} is not JSON: {exc}: {text[:500]!r}") from None
    found = _lone_surrogate(data)
    if found is not None:
        raise NotStrictJson(f"{what} holds a lone surrogate (not I-JSON, RFC 7493): {found[:80]!r}")
    return data
