"""A problem found in a deployment: which field, which value, what is wrong, and how to fix it.

Validation, the parser check and the host check all speak this one type, so `pdserve check` can
print every problem at once, one line each, or as JSON.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from pdserve.schema import strict_json

# The longest value a problem line shows in full.
MAX_SHOWN = 200
# A field the file must have and lacks, as every layer says it (pydantic's own words never reach a user).
MISSING = "is required and missing"
MISSING_FIX = "add it (`pdserve schema` describes it)"
# How alike a misspelling and a known name must be (difflib's ratio) for "did you mean" to name it.
CLOSE_ENOUGH = 0.6


def closest(value: Any, known: Iterable[str]) -> str | None:
    """The known name a misspelled `value` most likely meant, or None when none is close."""
    if not isinstance(value, str):
        return None
    names = sorted(set(known))
    folded = {name.lower().replace("-", "_"): name for name in names}
    return folded.get(value.lower().replace("-", "_")) or next(
        iter(difflib.get_close_matches(value, names, n=1, cutoff=CLOSE_ENOUGH)), None)


def did_you_mean(value: Any, known: Iterable[str]) -> str:
    """'did you mean "x"? ' for the known name closest to a misspelled `value`, or "" when none is close."""
    near = closest(value, known)
    return f"did you mean {strict_json.dumps(near)}? " if near else ""


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    field: str
    value: Any
    message: str
    fix: str
    severity: Severity = Severity.ERROR

    def line(self) -> str:
        # JSON escapes control characters, so a hostile value cannot split the line; a huge one is cut,
        # so it cannot drown the report.
        shown = strict_json.dumps(self.value) if self.value is not None else "(unset)"
        if len(shown) > MAX_SHOWN:
            shown = f"{shown[:MAX_SHOWN]}... ({len(shown)} characters)"
        return f"{self.severity}: {self.field} = {shown}: {self.message}; fix: {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        """As `--json` writes it: the value made JSON-safe (a `nan` from the file is the string "nan")."""
        data = asdict(self)
        data["severity"] = str(self.severity)
        safe: dict[str, Any] = strict_json.safe(data)  # a dict stays a dict, its values made JSON-safe
        return safe


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity is Severity.ERROR]


class ConfigError(Exception):
    """A deployment that cannot be used. Carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem], source: str = "deployment", checked: Sequence[str] = (),
                 skipped: Sequence[str] = ()):
        self.problems = problems
        self.source = source
        # What ran to find them (for `pdserve check`'s summary), and what could not run and why.
        self.checked = list(checked)
        self.skipped = list(skipped)
        super().__init__(f"{source}: " + "; ".join(p.line() for p in problems))
