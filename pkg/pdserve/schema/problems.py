"""A problem found in a deployment: which field, which value, what is wrong, and how to fix it.

Validation, the parser check and the host check all speak this one type, so `pdserve check` can
print every problem at once, one line each, or as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

# The longest value a problem line shows in full.
MAX_SHOWN = 200


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
        # json.dumps escapes control characters, so a hostile value cannot split the line; a huge one
        # is cut, so it cannot drown the report.
        shown = json.dumps(self.value, default=str) if self.value is not None else "(unset)"
        if len(shown) > MAX_SHOWN:
            shown = f"{shown[:MAX_SHOWN]}... ({len(shown)} characters)"
        return f"{self.severity}: {self.field} = {shown}: {self.message}; fix: {self.fix}"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = str(self.severity)
        return data


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity is Severity.ERROR]


class ConfigError(Exception):
    """A deployment that cannot be used. Carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem], source: str = "deployment"):
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(p.line() for p in problems))
