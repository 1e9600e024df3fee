"""`pdserve check`: the schema and field rules, the real parsers, and the host, in one report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdserve.check.host import NOT_EXECUTABLE, HostView, check_host, read_host
from pdserve.check.parsers import check_with_parsers, kernel_plugin_problems
from pdserve.check.sglang_python import needs_nixl, package_problems
from pdserve.check.target import HostRule, decide
from pdserve.probes import paths
from pdserve.render.renderable import load_renderable
from pdserve.render.toolchain import (
    SGLANG_PYTHON_PLACEHOLDER,
    missing_tools,
    preview_toolchain,
    sglang_python_origin,
    toolchain_problems,
)
from pdserve.schema.loading import CHECKED_ALL
from pdserve.schema.pins import NIXL_DISTRIBUTION, ROUTER_DISTRIBUTION
from pdserve.schema.problems import ConfigError, Problem, Severity, errors

SCHEMA_VERSION = 1


@dataclass
class CheckReport:
    source: str
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    host: HostRule | None = None  # None when the file did not load (nothing to decide it for)

    @property
    def valid(self) -> bool:
        return not errors(self.problems)

    @property
    def host_rule(self) -> str | None:
        return self.host.rule if self.host else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "valid": self.valid,
            "problems": [p.as_dict() for p in self.problems],
            "checked": self.checked,
            "skipped": self.skipped,
            "host_checks": {"on": self.host.on, "rule": self.host.rule} if self.host else None,
        }

    def summary(self) -> str:
        n_errors = len(errors(self.problems))
        return (f"{self.source}: {'valid' if self.valid else 'invalid'} ({n_errors} error(s), "
                f"{len(self.problems) - n_errors} warning(s); checked: {', '.join(self.checked) or 'nothing'})")


@dataclass(frozen=True)
class HostReading:
    """How the host is read, so tests can hand in a host."""

    systemd_missing: Callable[[], str | None]
    view: Callable[[], HostView]


def _systemd_missing() -> str | None:
    if not paths.systemd_running():
        return "systemd is not running here"
    return None


THIS_HOST = HostReading(_systemd_missing, read_host)


def run_check(config_path: Path | None, tool_overrides: dict[str, str | None], parsers: bool = True,
              host: bool | None = None, reading: HostReading | None = None) -> CheckReport:
    """`host`: True (--host), False (--no-host) or None (only on a host that looks like the target).
    `reading`: how the host is read (default THIS_HOST, looked up at call time so tests can swap it)."""
    reading = reading or THIS_HOST
    report = CheckReport(str(config_path) if config_path else "<default profile>")
    try:
        loaded = load_renderable(config_path)
    except ConfigError as exc:
        report.problems = exc.problems
        # Rules may have run on the fields that loaded: say so, not "checked: nothing".
        report.checked += exc.checked
        report.skipped += exc.skipped
        if exc.checked:
            report.skipped.append("parser check and host checks: they run once the errors above are fixed")
        return report
    dep = loaded.deployment
    report.problems += loaded.warnings
    report.checked.append(CHECKED_ALL)
    tools, tool_notes = preview_toolchain(dep, tool_overrides)
    # A tool path given by flag or found on PATH goes into ExecStart= like any deployment value.
    report.problems += toolchain_problems(dep, tool_overrides)
    view = reading.view() if host is not False else None
    report.host = decide(dep, host, reading.systemd_missing() if host is None else None, view)
    # A given SGLang Python is asked for its packages whenever it would be run (the parsers) or the host is
    # checked: one that is missing, cannot run or lacks the pins is refused here, not at launch. A missing
    # NIXL is an error only where the units will run this Python.
    origin = sglang_python_origin(dep, tool_overrides)
    have_python = tools.sglang_python != SGLANG_PYTHON_PLACEHOLDER
    asked = have_python and (parsers or report.host.on)
    pinned = (package_problems(dep, tools.sglang_python, origin,
                               nixl_severity=Severity.ERROR if report.host.on else Severity.WARNING)
              if asked else [])
    if parsers and errors(pinned):
        # The Python's error says it all; its parsers would only repeat it, or judge the argv by another
        # version's rules.
        report.skipped.append(f"parser check skipped: {origin} is not an SGLang Python with the pins (see its error)")
    elif parsers and have_python:
        parsed = check_with_parsers(dep, tools.sglang_python, required_by=origin if report.host.on else None)
        report.problems += parsed.problems
        rejected = {p.field.split(".")[0].split(" ")[0] for p in parsed.problems}
        report.checked += [f"{role} argv accepted by the real parser"
                           for role in parsed.checked if role not in rejected]
        report.skipped += parsed.skipped
    elif parsers:
        report.skipped.append("parser check skipped: no SGLang Python was given (tools.sglang_python, "
                              "tools.sglang_venv or --sglang-python)")
    else:
        report.skipped.append("parsers: --no-parsers")
    report.problems += pinned
    if asked and not errors(pinned):
        nixl = f" and {NIXL_DISTRIBUTION}" if needs_nixl(dep) and not pinned else ""
        report.checked.append(f"{origin} has the pinned sglang and router ({ROUTER_DISTRIBUTION}){nixl}")
    elif have_python and not asked:
        report.skipped.append(f"{origin}: not asked for its packages (--no-parsers, and no host checks)")
    if report.host.on:
        seen = check_host(dep, tools, view)
        # The SGLang Python was asked above: "not an executable file" would count its one cause twice (or, with
        # none named, be about the placeholder: then say what is missing and how to name it).
        seen.problems = [p for p in seen.problems if (p.field, p.message) != ("tools.sglang_python", NOT_EXECUTABLE)]
        if not have_python:
            report.problems += missing_tools(dep, tool_overrides, "sglang_python")
        report.problems += seen.problems
        report.checked += seen.passed
        report.skipped += seen.skipped
        if have_python and not errors(pinned):
            plugin, plugin_asked = kernel_plugin_problems(dep, tools.sglang_python, origin)
            report.problems += plugin
            if plugin_asked and not plugin:
                report.checked.append(f"{origin} has pdserve's SGLang plugin (attention_kernels = \"pdserve\")")
    else:
        # Without the host check nobody looks at the tools; say which were only assumed.
        report.skipped += tool_notes
    return report
