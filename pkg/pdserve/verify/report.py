"""The report: a rich table for people, stable JSON (schema_version) for machines.

The JSON's schema is the pydantic model below (`pdserve verify --schema` prints it); bump
SCHEMA_VERSION on any change that is not a pure addition.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdserve.schema import strict_json
from pdserve.verify.presence import Presence
from pdserve.verify.printable import LINE_CHARS, printable
from pdserve.verify.result import CheckResult, Status

SCHEMA_VERSION = 1

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BROKEN = 0, 1, 2, 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckRecord(_Strict):
    id: str = Field(description="Stable check id, e.g. kv.decode")
    status: Literal["pass", "fail", "warn", "skip"]
    observed: str = Field(description="What was measured (for skip: why the check did not run)")
    expected: str
    duration_ms: int = Field(ge=0)
    remediation: str = Field(description="What to do when the status is fail or warn; empty on pass")
    details: list[str] = Field(description="Per-item findings: journal lines, per-GPU values, ...")
    attempts: int = Field(ge=1, description="How often it ran (--wait retries failing checks)")


class Summary(_Strict):
    pass_: int = Field(alias="pass", ge=0)
    fail: int = Field(ge=0)
    warn: int = Field(ge=0)
    skip: int = Field(ge=0)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Report(_Strict):
    schema_version: Literal[1]
    deployment: str
    source: str
    host: str | None = Field(None, description="Multi-host deployments: the host this run stood on, whose "
                             "host-local checks it made (the others' are skipped, naming their host)")
    verdict: str = Field(description="The run in one line, what the table says in detail: OK, FAILED (how many, "
                         "which first), NOTHING RUNS HERE (no unit of the deployment installed on this host and none "
                         "of its ports answering), or VERIFIER ERROR")
    runs_here: bool | None = Field(description="Whether any unit of the deployment is installed on this host or any "
                                   "of its ports answers here; null when that was not looked at")
    ok: bool = Field(description="No check failed and the verifier did not break")
    exit_code: Literal[0, 1, 3]
    duration_ms: int = Field(ge=0)
    summary: Summary
    verifier_errors: list[str] = Field(description="Checks the verifier could not run because of its own bug")
    checks: list[CheckRecord]


def exit_code(results: list[CheckResult], broken: list[str]) -> int:
    if broken:
        return EXIT_BROKEN
    return EXIT_FAILED if any(r.status is Status.FAIL for r in results) else EXIT_OK


def _record(check: dict) -> dict:
    """A check's record with every text printable (pdserve.verify.printable): servers' bytes end up in it."""
    text = {key: printable(check[key]) for key in ("id", "observed", "expected", "remediation")}
    return {**check, **text, "details": [printable(line, LINE_CHARS) for line in check["details"]]}


def verdict(deployment: str, results: list[CheckResult], broken: list[str], presence: Presence | None,
            host: str | None = None) -> str:
    """The run in one line: whether it works, and if not, the one thing to know first."""
    where = f"host {host}" if host else "this host"
    failing = [r.id for r in results if r.status is Status.FAIL]
    if broken:
        return f"VERIFIER ERROR: {len(broken)} check(s) could not run because of a bug in pdserve verify (see below)"
    if presence is not None and not presence.anything:
        systemd = f" (systemd not asked: {presence.systemd})" if presence.systemd else ""
        return (f"NOTHING RUNS HERE: no unit of deployment {deployment} is installed on {where}{systemd} and none of "
                f"its ports answers ({', '.join(presence.looked_at)}): run `pdserve verify` where it runs, or "
                f"install and start it here (README: Quick start)")
    ran = [r for r in results if r.status is not Status.SKIP]
    if not failing:
        warned = sum(r.status is Status.WARN for r in results)
        return (f"OK: deployment {deployment} on {where}: {len(ran)} check(s) pass" +
                (f", {warned} with a warning" if warned else ""))
    first = ", ".join(failing[:3]) + (", ..." if len(failing) > 3 else "")
    return f"FAILED: {len(failing)} of {len(ran)} check(s) that ran fail on {where} ({first}); the fixes are below"


def build(deployment: str, source: str, results: list[CheckResult], broken: list[str], duration_ms: int,
          host: str | None = None, presence: Presence | None = None) -> dict:
    counts = {s.value: sum(r.status is s for r in results) for s in Status}
    code = exit_code(results, broken)
    data = {
        "schema_version": SCHEMA_VERSION,
        "deployment": printable(deployment),
        "source": printable(source),
        **({"host": printable(host)} if host else {}),
        "verdict": printable(verdict(deployment, results, broken, presence, host), LINE_CHARS),
        "runs_here": presence.anything if presence is not None else None,
        "ok": code == EXIT_OK,
        "exit_code": code,
        "duration_ms": duration_ms,
        "summary": counts,
        "verifier_errors": [printable(error, LINE_CHARS) for error in broken],
        "checks": [_record(r.as_dict()) for r in results],
    }
    Report.model_validate(data)  # the JSON we print always matches the published schema
    return data


def to_json(data: dict) -> str:
    return strict_json.dumps(data, indent=2, ensure_ascii=False)


def json_schema() -> dict:
    schema = Report.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "pdserve verify report"
    return schema


_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def _deselected(check: dict) -> bool:
    return check["status"] == "skip" and check["observed"].startswith(("skipped: not selected", "skipped: excluded"))


def print_table(console: Console, data: dict) -> None:
    """Every text goes in as rich Text, never as markup: a `[` in a server's answer is printed, not parsed."""
    on = f" on host {data['host']}" if data.get("host") else ""
    console.print(Text(data["verdict"], style=_STYLE["pass" if data["ok"] else "fail"]), soft_wrap=True)
    table = Table(title=Text(f"pdserve verify: {data['deployment']} ({data['source']}){on}"), expand=True)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("observed", ratio=3)
    table.add_column("expected", ratio=2)
    table.add_column("ms", justify="right", no_wrap=True)
    hidden = [c["id"] for c in data["checks"] if _deselected(c)]
    for check in data["checks"]:
        if _deselected(check):
            continue
        observed = Text(check["observed"])
        # A detail the observed text already holds would only print it twice.
        for line in [line for line in check["details"] if line not in check["observed"]][:12]:
            observed.append(f"\n  {line}", style="dim")
        table.add_row(Text(check["id"]), Text(check["status"], style=_STYLE[check["status"]]), observed,
                      Text(check["expected"]), str(check["duration_ms"]))
    console.print(table)
    if hidden:
        console.print(Text(f"not run (--only/--skip): {', '.join(hidden)}", style="dim"), soft_wrap=True)
    # Remediations below the table, one unwrapped line each, so they can be copied.
    for check in data["checks"]:
        if check["status"] in ("fail", "warn") and check["remediation"]:
            console.print(Text(f"{check['status']} {check['id']}: ", style=_STYLE[check["status"]])
                          + Text(check["remediation"]), soft_wrap=True)
    s = data["summary"]
    verdict = "OK" if data["ok"] else ("VERIFIER ERROR" if data["exit_code"] == EXIT_BROKEN else "FAILED")
    console.print(f"{verdict}: {s['pass']} pass, {s['fail']} fail, {s['warn']} warn, {s['skip']} skip "
                  f"in {data['duration_ms'] / 1000:.1f} s", style=_STYLE["pass" if data["ok"] else "fail"])
    for error in data["verifier_errors"]:
        console.print(Text(f"verifier error: {error}", style="bold red"), soft_wrap=True)
