"""One example through pdserve's public entry points: the deployment written as a JSON file, then
`pdserve check --json`, and for an accepted file `pdserve plan --json`, `pdserve plan` (plain shell) and
`pdserve render --out DIR` (per host of a multi-host file), run in-process through the CLI's click group.

The tier reads pdserve only through these commands, so it keeps working when the renderers' internals change.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.render.renderable import renderable_from_data
from pdserve.schema.problems import ConfigError
from tests.property.schema_fields import FieldCase, mutated
from tests.property.strict_json import strict_loads

# What an exit code means (pdserve.cli.exits): 0 fine, 1 problems of the deployment, 2 usage, 3 a crash.
OK, PROBLEMS = 0, 1


@dataclass
class HostOutput:
    """Everything pdserve rendered for one host (None: a single-host file)."""

    host: str | None
    out: Path
    files: dict[str, str]  # path under --out -> text, as `render` wrote it
    plan: dict[str, Any]  # `plan --json`
    plan_text: str  # `plan`, piped


@dataclass
class Example:
    case: FieldCase
    value: Any
    data: dict[str, Any]
    source: Path
    check: dict[str, Any]
    hosts: list[HostOutput] = field(default_factory=list)

    @property
    def accepted(self) -> bool:
        return bool(self.check["valid"])

    @property
    def name(self) -> str:
        return self.data["name"]

    def describe(self) -> str:
        return f"{self.case.id} = {self.value!r}"[:300]


def _invoke(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"pdserve {' '.join(args[:2])} raised {result.exception!r}") from result.exception
    return result.exit_code, result.stdout, result.stderr


def loader_verdict(data: dict[str, Any]) -> list[Any] | None:
    """The in-process loader's problems (None: accepted). Anything but ConfigError escaping is a bug."""
    try:
        renderable_from_data(copy.deepcopy(data), "<property>")
    except ConfigError as exc:
        return exc.problems
    return None


def run_example(case: FieldCase, value: Any, work: Path, name: str) -> Example:
    data = mutated(case, value, name)
    work.mkdir(parents=True, exist_ok=True)
    source = work / "deployment.json"
    # json.dumps writes NaN/Infinity and escapes lone surrogates: the loader's JSON reader takes all of them,
    # so every value hypothesis draws reaches pdserve exactly.
    source.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = _invoke(["check", "--json", "--no-host", "--no-parsers", "-c", str(source)])
    assert code in (OK, PROBLEMS), f"check exited {code}: {err[-2000:]}"
    report = strict_loads(out, "check --json")
    assert report["valid"] is (code == OK), (code, report["valid"])
    example = Example(case, value, data, source, report)
    if not example.accepted:
        return example
    for host in list(data.get("hosts") or {}) or [None]:
        where = ["--host", host] if host else []
        out_dir = work / f"render-{host or 'single'}"
        # The units read the deployment where `plan` says they will (its default for /etc/systemd/system),
        # so the rendered units and the planned ones are the same text.
        runtime = f"/etc/systemd/system/pdserve-{data['name']}.json"
        # The file's tool paths are drawn values, no SGLang Python to ask: the tier follows them into the outputs.
        code, _rendered, err = _invoke(["render", "-c", str(source), "--out", str(out_dir), "--config-path", runtime,
                                       "--no-python-check", *where])
        assert code == OK, f"check accepted the file, render exited {code}: {err[-2000:]}"
        code, plan_json, err = _invoke(["plan", "--json", "-c", str(source), *where])
        assert code == OK, f"check accepted the file, plan --json exited {code}: {err[-2000:]}"
        code, plan_text, err = _invoke(["plan", "-c", str(source), *where])
        assert code == OK, f"check accepted the file, plan exited {code}: {err[-2000:]}"
        files = {str(p.relative_to(out_dir)): p.read_text(encoding="utf-8")
                 for p in sorted(out_dir.rglob("*")) if p.is_file()}
        example.hosts.append(HostOutput(host, out_dir, files, strict_loads(plan_json, "plan --json"), plan_text))
    return example
