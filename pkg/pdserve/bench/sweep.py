"""One layout's sweep: its points' results, in order, and what was said about them. Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdserve.bench.figures import PointResult, inconsistencies


@dataclass
class Sweep:
    layout: str  # "pd" or "single" under --compare; "serving" for a plain run (whatever serves)
    url: str
    results: list[PointResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(r.measured for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout, "url": self.url, "interrupted": self.interrupted, "notes": list(self.notes),
                "points": [{**r.as_dict(), "inconsistencies": inconsistencies(r)} for r in self.results]}
