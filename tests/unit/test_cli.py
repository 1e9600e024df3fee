"""The CLI as a user meets it: exit codes, one line per problem, no traceback, nothing half written."""

from __future__ import annotations

import json
import tomllib

from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.schema.loading import default_profile_text


def run(*args):
    return CliRunner().invoke(main, list(args))


def write_broken(tmp_path):
    data = tomllib.loads(default_profile_text())
    data["decode"]["gpus"] = [3, 4, 5, 6]
    data["model"]["tool_call_parser"] = "deepseek-v4"
    data["router"]["prometheus_port"] = data["router"]["port"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


def test_plan_on_the_embedded_default_shows_topology_commands_and_units():
    result = run("plan", "--sglang-python", "/opt/sg/bin/python", "--numactl", "/usr/bin/numactl",
                 "--pdserve", "/bin/pdserve")
    assert result.exit_code == 0, result.output
    for expected in ("sglang-dsv4-prefill", "http://127.0.0.1:30002", "--disaggregation-mode prefill",
                     "smg.launch_router", "UCX_TLS=cuda_copy,cuda_ipc,tcp", "sglang-dsv4-router.service",
                     "Conflicts=sglang-dsv4-prefill.service"):
        assert expected in result.output


def test_check_broken_file_exits_1_with_one_line_per_problem(tmp_path):
    result = run("check", "-c", str(write_broken(tmp_path)), "--no-host", "--no-parsers")
    assert result.exit_code == 1
    problem_lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(problem_lines) == 3
    assert any(line.startswith("error: decode.gpus = [3, 4, 5, 6]") for line in problem_lines)
    assert any(line.startswith('error: model.tool_call_parser = "deepseek-v4"') for line in problem_lines)
    assert any(line.startswith("error: router.prometheus_port = 30001") for line in problem_lines)
    assert "Traceback" not in result.output


def test_check_json_report(tmp_path):
    result = run("check", "-c", str(write_broken(tmp_path)), "--no-host", "--no-parsers", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["schema_version"] == 1 and report["valid"] is False
    assert {p["field"] for p in report["problems"]} == {"decode.gpus", "model.tool_call_parser",
                                                        "router.prometheus_port"}
    assert all(p["fix"] for p in report["problems"])


def test_check_reference_is_valid_and_names_what_it_skipped():
    result = run("check", "--no-host", "--no-parsers", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["valid"] is True
    assert report["skipped"][0] == "parsers: --no-parsers"
    assert report["host_checks"] == {"on": False, "rule": "off (--no-host)"}
    # Tools not found on this machine are named as assumed, not silently passed.
    assert all(note.startswith("tools.") for note in report["skipped"][1:])


def test_check_unreadable_and_malformed_files(tmp_path):
    missing = run("check", "-c", str(tmp_path / "nope.toml"), "--no-host", "--no-parsers")
    assert missing.exit_code == 1 and "cannot be read" in missing.output
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    malformed = run("check", "-c", str(bad), "--no-host", "--no-parsers")
    assert malformed.exit_code == 1 and "is not valid TOML" in malformed.output
    assert "Traceback" not in missing.output + malformed.output


def test_usage_error_exits_2():
    assert run("check", "--frobnicate").exit_code == 2
    assert run("wait-ready", "sidecar").exit_code == 2


def test_render_writes_units_and_the_config_they_read(tmp_path):
    out = tmp_path / "units"
    result = run("render", "--out", str(out), "--sglang-python", "/opt/sg/bin/python",
                 "--numactl", "/usr/bin/numactl", "--pdserve", "/opt/pd/bin/pdserve", "--no-python-check")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["pdserve-dsv4.json", "sglang-dsv4-decode.service", "sglang-dsv4-prefill.service",
                     "sglang-dsv4-router.service", "sglang-dsv4.service"]
    config = out / "pdserve-dsv4.json"
    assert f"--config {config}" in (out / "sglang-dsv4-router.service").read_text()
    # The JSON the units read loads back to the same deployment.
    check = run("check", "-c", str(config), "--no-host", "--no-parsers")
    assert check.exit_code == 0, check.output


def test_render_refuses_a_broken_deployment_and_writes_nothing(tmp_path):
    out = tmp_path / "units"
    result = run("render", "-c", str(write_broken(tmp_path)), "--out", str(out), "--sglang-python", "/x/python",
                 "--numactl", "/x/numactl", "--pdserve", "/x/pdserve")
    assert result.exit_code == 1
    assert not out.exists()


def test_render_needs_absolute_tools(tmp_path):
    result = run("render", "--out", str(tmp_path), "--sglang-python", "python3", "--numactl", "/x/numactl",
                 "--pdserve", "/x/pdserve")
    assert result.exit_code == 1
    # The path came from the flag, so the problem names the flag (issue 14: errors name the input).
    assert "--sglang-python" in result.output and "absolute" in result.output


def test_schema_command_prints_json_schema():
    result = run("schema")
    assert result.exit_code == 0
    assert json.loads(result.output)["title"] == "pdserve deployment"

