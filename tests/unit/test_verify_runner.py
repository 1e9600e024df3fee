"""Selection, retries, exit codes and the JSON report of `pdserve verify`, without any host probe."""

import json

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.probes.observations import Unavailable
from pdserve.schema.loading import load
from pdserve.verify import report, runner
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import checks_for
from pdserve.verify.result import failed, passed
from tests.fixtures.fake_clock import FakeClock
from tests.fixtures.verify_checks import replace_check

CHECKS = checks_for(expectations(load().deployment))  # the default profile's
IDS = list(CHECKS)


def test_selection_by_prefix_and_reasons():
    plan = runner.select(IDS, [], ["units", "gpu.memory"])
    assert plan["units.fallback"] == "excluded by --skip units"
    assert plan["gpu.memory"] == "excluded by --skip gpu.memory" and plan["gpu.processes"] is None
    only = runner.select(IDS, ["e2e"], [])
    assert only["e2e.tools"] is None and only["kv.decode"] == "not selected by --only e2e"


def test_unknown_selection_is_refused():
    with pytest.raises(runner.SelectionError, match="'e3' matches no check"):
        runner.select(IDS, ["e3"], [])


def _run(checks, wait=0.0):
    clock = FakeClock()
    plan = dict.fromkeys(checks)
    return runner.run(None, plan, wait=wait, interval=1.0, checks=checks, clock=clock, sleep=clock.sleep)


def test_wait_retries_failing_checks_until_they_pass():
    calls = {"n": 0}

    def flaky(_ctx):
        calls["n"] += 1
        return passed("a", "ok", "ok") if calls["n"] >= 3 else failed("a", "not yet", "ok", "wait")

    results, broken = _run({"a": flaky, "b": lambda _ctx: passed("b", "ok", "ok")}, wait=10)
    assert [r.status for r in results] == ["pass", "pass"] and not broken
    assert results[0].attempts == 3 and results[1].attempts == 1


def test_wait_gives_up_at_the_deadline():
    results, _ = _run({"a": lambda _ctx: failed("a", "never", "ok", "fix it")}, wait=3)
    assert results[0].status == "fail" and results[0].attempts == 4  # t=0,1,2,3


def test_unavailable_probe_skips_and_a_crash_is_a_verifier_error():
    def no_nvml(_ctx):
        raise Unavailable("NVML is not available on this host")

    def buggy(_ctx):
        raise KeyError("oops")

    results, broken = _run({"gpu": no_nvml, "bug": buggy})
    assert results[0].status == "skip" and results[0].observed == "skipped: NVML is not available on this host"
    assert results[1].status == "fail" and len(broken) == 1 and "KeyError" in broken[0]
    assert report.exit_code(results, broken) == report.EXIT_BROKEN


def test_report_matches_its_schema_and_exit_codes():
    ok = report.build("d", "src", [passed("a", "x", "y")], [], 5)
    assert ok["exit_code"] == 0 and ok["summary"] == {"pass": 1, "fail": 0, "warn": 0, "skip": 0}
    bad = report.build("d", "src", [failed("a", "x", "y", "z")], [], 5)
    assert bad["exit_code"] == 1 and not bad["ok"]
    report.Report.model_validate_json(report.to_json(bad))
    with pytest.raises(ValueError):
        report.Report.model_validate({**bad, "checks": [{**bad["checks"][0], "status": "maybe"}]})
    schema = report.json_schema()
    assert schema["properties"]["schema_version"]["const"] == 1
    assert "checks" in schema["required"]


def test_cli_schema_and_list():
    cli = CliRunner()
    schema = json.loads(cli.invoke(main, ["verify", "--schema"]).output)
    assert schema["title"] == "pdserve verify report"
    assert "e2e.tools" in cli.invoke(main, ["verify", "--list"]).output.split()


def test_cli_usage_errors_exit_2(tmp_path):
    cli = CliRunner()
    result = cli.invoke(main, ["verify", "--only", "nonsense"])
    assert result.exit_code == 2 and "matches no check" in result.output
    bad = tmp_path / "d.toml"
    bad.write_text('name = "x"\n[model]\npath = "/m"\n[prefill]\ngpus = [0]\nport = 70000\n')
    result = cli.invoke(main, ["verify", "-c", str(bad)])
    # A broken file is Exit.PROBLEMS from every command (pdserve.cli.exits), verify included.
    assert result.exit_code == 1 and "prefill.port" in result.output and "Traceback" not in result.output


def test_cli_exit_1_on_failure_and_3_when_a_check_crashes(monkeypatch):
    replace_check(monkeypatch, "kv.decode", lambda _ctx: failed("kv.decode", "1024 tokens", ">= 131072",
                                                                          "raise decode.mem_fraction_static"))
    cli = CliRunner()
    result = cli.invoke(main, ["verify", "--json", "--only", "kv.decode"])
    assert result.exit_code == 1
    data = report.Report.model_validate_json(result.stdout)
    assert [c.status for c in data.checks if c.id == "kv.decode"] == ["fail"]
    table = cli.invoke(main, ["verify", "--only", "kv.decode"])
    assert table.exit_code == 1 and "raise decode.mem_fraction_static" in table.output

    def crash(_ctx):
        raise ZeroDivisionError("division by zero")

    replace_check(monkeypatch, "kv.decode", crash)
    result = cli.invoke(main, ["verify", "--json", "--only", "kv.decode"])
    assert result.exit_code == 3
    assert "ZeroDivisionError" in json.loads(result.stdout)["verifier_errors"][0]


def _context(dep, options=None, systemctl=None):
    import httpx

    from pdserve.verify.expect import expectations

    return runner.Context(dep, expectations(dep), options or runner.Options(), httpx.Client(), systemctl)


def test_the_key_is_read_through_the_one_reader(reference, tmp_path, monkeypatch):
    """The configured file, or the unit's systemd credential when one is passed; --api-key-file names
    the file itself. Errors name the file (exposure.auth reports them)."""
    configured = tmp_path / "router.key"
    configured.write_text("from-file\n")
    dep = reference.model_copy(update={"router": reference.router.model_copy(update={"api_key_file": str(configured)})})
    assert _context(dep).api_key() == ("from-file", None)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("from-credential\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert _context(dep).api_key() == ("from-credential", None)
    other = tmp_path / "other.key"
    other.write_text("")
    key, error = _context(dep, runner.Options(api_key_file=str(other))).api_key()
    assert key is None and error == f"the API key file {other} is empty; write the key into it"
    assert _context(reference).api_key() == (None, None)


def test_a_systemctl_that_fails_makes_the_unit_checks_skip(reference, monkeypatch):
    import subprocess

    from pdserve.probes.systemctl import Systemctl
    from pdserve.verify import context

    def refused(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "Failed to connect to bus: Host is down\n")

    monkeypatch.setattr(context, "unavailable_reason", lambda: None)
    ctx = _context(reference, systemctl=Systemctl(runner=refused))
    result, error = runner.run_one("units.prefill", CHECKS["units.prefill"], ctx)
    assert error is None and result.status == "skip" and "Host is down" in result.observed
