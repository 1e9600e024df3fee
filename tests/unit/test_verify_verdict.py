"""`pdserve verify` leads with a one-line verdict, in the table and in --json (issue 42): on a host where
nothing of the deployment runs (no unit installed, no port answering) it says that, not only 31 rows; and no
cell prints a detail its observed text already holds."""

from __future__ import annotations

import io
import json
import socket
import subprocess

import httpx
from click.testing import CliRunner
from rich.console import Console

from pdserve.cli.main import main
from pdserve.probes.systemctl import Systemctl
from pdserve.verify import context, presence, report, runner
from pdserve.verify.expect import expectations
from pdserve.verify.result import failed, passed, skipped, warned
from tests.fixtures.verify_checks import replace_check

SHOW = """Id=sglang-dsv4-prefill.service
LoadState=loaded
ActiveState=failed
SubState=failed

Id=sglang-dsv4-decode.service
LoadState=not-found
ActiveState=inactive
SubState=dead
"""


def _context(dep, show: str | None, monkeypatch) -> runner.Context:
    if show is None:
        monkeypatch.setattr(context, "unavailable_reason", lambda: "systemd is not running on this host")
        systemctl = None
    else:
        monkeypatch.setattr(context, "unavailable_reason", lambda: None)
        systemctl = Systemctl(runner=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, show, ""))
    return runner.Context(dep, expectations(dep), runner.Options(probe_timeout=1), httpx.Client(), systemctl)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moved(reference, ports: dict[str, int]):
    """The reference deployment on ports nothing else here uses (or that the test listens on)."""
    update = {role: getattr(reference, role).model_copy(update={"port": port}) for role, port in ports.items()}
    return reference.model_copy(update=update)


def test_nothing_installed_and_nothing_answering_is_said_first(reference, monkeypatch):
    dep = _moved(reference, {"prefill": _free_port(), "decode": _free_port(), "router": _free_port()})
    seen = presence.observe(_context(dep, None, monkeypatch))
    assert not seen.anything and seen.systemd == "systemd is not running on this host"
    assert "sglang-dsv4-router" in seen.looked_at and f"prefill 127.0.0.1:{dep.prefill.port}" in seen.looked_at
    data = report.build("dsv4", "<t>", [failed("router.readiness", "no answer", "200", "start it")], [], 5,
                        presence=seen)
    assert data["runs_here"] is False
    assert data["verdict"].startswith("NOTHING RUNS HERE: no unit of deployment dsv4 is installed on this host "
                                      "(systemd not asked: systemd is not running on this host) and none of its "
                                      "ports answers (sglang-dsv4-prefill, ")
    out = io.StringIO()
    report.print_table(Console(file=out, width=200), data)
    assert out.getvalue().splitlines()[0] == data["verdict"]


def test_an_installed_unit_or_an_answering_port_is_something(reference, monkeypatch):
    dep = _moved(reference, {"prefill": _free_port(), "decode": _free_port(), "router": _free_port()})
    seen = presence.observe(_context(dep, SHOW, monkeypatch))
    assert seen.installed == ["sglang-dsv4-prefill"] and seen.anything and seen.systemd is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        dep = _moved(reference, {"prefill": _free_port(), "decode": _free_port(),
                                 "router": listener.getsockname()[1]})
        seen = presence.observe(_context(dep, None, monkeypatch))
    assert seen.answering == [f"router 127.0.0.1:{dep.router.port}"] and seen.anything


def test_the_verdict_of_a_run_that_works_or_fails():
    somewhere = presence.Presence(["u"], [], ["u"])
    good = [passed("a", "x", "x"), warned("b", "x", "y", "z"), skipped("c", "why")]
    assert report.verdict("dsv4", good, [], somewhere) == "OK: deployment dsv4 on this host: 2 check(s) pass, " \
        "1 with a warning"
    bad = [*good, *(failed(f"f{i}", "x", "y", "z") for i in range(4))]
    assert report.verdict("dsv4", bad, [], somewhere, "gpu-a") == (
        "FAILED: 4 of 6 check(s) that ran fail on host gpu-a (f0, f1, f2, ...); the fixes are below")
    assert report.verdict("dsv4", bad, ["kv: boom"], None).startswith("VERIFIER ERROR: 1 check(s)")


def test_the_json_report_carries_the_verdict_and_matches_its_schema(monkeypatch):
    replace_check(monkeypatch, "kv.decode", lambda _ctx: passed("kv.decode", "1", "1"))
    result = CliRunner().invoke(main, ["verify", "--json", "--only", "kv.decode", "--probe-timeout", "0.5"])
    data = report.Report.model_validate_json(result.stdout)
    assert data.verdict == json.loads(result.stdout)["verdict"] and data.runs_here is not None
    assert "verdict" in report.json_schema()["required"]


def test_a_detail_the_observed_text_holds_is_not_printed_twice():
    detail = "prefill before: http://127.0.0.1:30000/metrics: no answer"
    check = failed("metrics.kv_transfer", f"no reading to compare: {detail}", "y", "z", [detail, "another line"])
    data = report.build("dsv4", "<t>", [check], [], 1)
    out = io.StringIO()
    report.print_table(Console(file=out, width=400), data)
    assert out.getvalue().count("prefill before:") == 1 and "another line" in out.getvalue()
