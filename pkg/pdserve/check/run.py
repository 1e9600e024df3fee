"""`pdserve check`: the schema and field rules, the real parsers, and the host, in one report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdserve.check.host import check_host
from pdserve.check.parsers import check_with_parsers
from pdserve.render.renderable import load_renderable
from pdserve.render.toolchain import preview_toolchain, toolchain_problems
from pdserve.schema.problems import ConfigError, Problem, errors

SCHEMA_VERSION = 1


@dataclass
class CheckReport:
    source: str
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not errors(self.problems)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "valid": self.valid,
            "problems": [p.as_dict() for p in self.problems],
            "checked": self.checked,
            "skipped": self.skipped,
        }

    def summary(self) -> str:
        n_errors = len(errors(self.problems))
        return (f"{self.source}: {'valid' if self.valid else 'invalid'} ({n_errors} error(s), "
                f"{len(self.problems) - n_errors} warning(s); checked: {', '.join(self.checked) or 'nothing'})")


def run_check(config_path: Path | None, tool_overrides: dict[str, str | None],
              parsers: bool = True, host: bool = True) -> CheckReport:
    report = CheckReport(str(config_path) if config_path else "<default profile>")
    try:
        loaded = load_renderable(config_path)
    except ConfigError as exc:
        report.problems = exc.problems
        return report
    dep = loaded.deployment
    report.problems += loaded.warnings
    report.checked.append("schema and field rules")
    tools, tool_notes = preview_toolchain(dep, tool_overrides)
    # A tool path given by flag or found on PATH goes into ExecStart= like any deployment value.
    report.problems += toolchain_problems(dep, tool_overrides)
    if parsers:
        parsed = check_with_parsers(dep, tools.sglang_python)
        report.problems += parsed.problems
        rejected = {p.field.split(".")[0].split(" ")[0] for p in parsed.problems}
        report.checked += [f"{role} argv accepted by the real parser" for role in parsed.checked if role not in rejected]
        report.skipped += parsed.skipped
    else:
        report.skipped.append("parsers: --no-parsers")
    if host:
        seen = check_host(dep, tools)
        report.problems += seen.problems
        report.checked += seen.passed
        report.skipped += seen.skipped
    else:
        report.skipped.append("host: --no-host")
        # Without the host check nobody looks at the tools; say which were only assumed.
        report.skipped += tool_notes
    return report
