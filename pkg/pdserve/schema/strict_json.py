"""JSON that every parser takes (RFC 8259): the one way pdserve's `--json` outputs are written.

Python's json module writes NaN, Infinity and -Infinity, which are not JSON, and passes a lone surrogate
through as an escape that strict parsers refuse. A problem echoes whatever a file held (`nan` and `inf`
are TOML floats), so values are made safe before they are written, and writing refuses (allow_nan=False)
anything that slipped past.
"""

from __future__ import annotations

import json
import math
from typing import Any


def safe(value: Any) -> Any:
    """`value` as JSON can hold it: a non-finite float as its name ("nan", "inf", "-inf"), a string with lone
    surrogates with those written as \\udXXX text, tuples and sets as lists, keys as strings, anything else
    unknown as its str()."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, dict):
        return {_text(key if isinstance(key, str) else str(key)): safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [safe(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((safe(item) for item in value), key=repr)
    return _text(str(value))


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def dumps(value: Any, **options: Any) -> str:
    """json.dumps of safe(value), refusing NaN and infinities (none can remain)."""
    return json.dumps(safe(value), allow_nan=False, **options)
