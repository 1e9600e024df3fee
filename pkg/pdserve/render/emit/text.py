"""Rules shared by the emitters of line-oriented languages: which characters end or break a line."""

from __future__ import annotations

import unicodedata

# Characters some reader takes for the end of a line, besides the C0/C1 controls (category Cc): NEL is Cc
# already; the Unicode line and paragraph separators are not.
_BREAKS = {"\u2028", "\u2029"}


def breaks_line(char: str) -> bool:
    return unicodedata.category(char) == "Cc" or char in _BREAKS


def shown(text: str) -> str:
    """`text` with every control character, line break and lone surrogate written as a Python escape
    (\\n, \\x1b, \\u2028), and a backslash doubled so the escape reads back: one line, and the value still
    legible and exact."""
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif breaks_line(char) or unicodedata.category(char) == "Cs":  # a lone surrogate: not writable
            out.append(repr(char)[1:-1])
        else:
            out.append(char)
    return "".join(out)
