"""One check's outcome: the unit of the verifier's report (table row, JSON object)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    observed: str
    expected: str
    remediation: str = ""
    details: tuple[str, ...] = ()
    duration_ms: int = 0
    attempts: int = 1

    def timed(self, duration_ms: int, attempts: int = 1) -> CheckResult:
        return replace(self, duration_ms=duration_ms, attempts=attempts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": str(self.status),
            "observed": self.observed,
            "expected": self.expected,
            "duration_ms": self.duration_ms,
            "remediation": self.remediation,
            "details": list(self.details),
            "attempts": self.attempts,
        }


def passed(id: str, observed: str, expected: str, details: tuple[str, ...] | list[str] = ()) -> CheckResult:
    return CheckResult(id, Status.PASS, observed, expected, "", tuple(details))


def failed(id: str, observed: str, expected: str, remediation: str,
           details: tuple[str, ...] | list[str] = ()) -> CheckResult:
    return CheckResult(id, Status.FAIL, observed, expected, remediation, tuple(details))


def warned(id: str, observed: str, expected: str, remediation: str,
           details: tuple[str, ...] | list[str] = ()) -> CheckResult:
    return CheckResult(id, Status.WARN, observed, expected, remediation, tuple(details))


def skipped(id: str, reason: str, expected: str = "", remediation: str = "") -> CheckResult:
    return CheckResult(id, Status.SKIP, f"skipped: {reason}", expected, remediation)
