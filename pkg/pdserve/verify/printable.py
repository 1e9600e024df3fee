"""Text a server sent, made safe to print and to put in JSON: every report goes through here.

A server's answer reaches the report's observed values, details and errors. Lone surrogates (from a JSON
`\\udXXX` escape) cannot be encoded as UTF-8, control characters and NUL rewrite a terminal, bidi
overrides reorder what a reader sees; each becomes a visible escape. Long values are cut, saying so.
"""

from __future__ import annotations

import re

FIELD_CHARS = 2000  # observed, expected, remediation
LINE_CHARS = 500  # one detail line, one verifier error

# C0 controls but tab and newline, DEL and C1, bidi embeddings/overrides/isolates, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, limit: int = FIELD_CHARS) -> str:
    text = _UNSAFE.sub(_escape, str(text))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
