"""The rendered command lines against the real parsers of sglang 0.5.23 and smg 1.13.0 (the router)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from click.testing import CliRunner

from pdserve.check.parsers import check_with_parsers
from pdserve.cli.main import main
from pdserve.schema.loading import deployment_from_data
from tests.conftest import require_or_skip


@pytest.fixture(scope="module")
def parsers_available():
    have = importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("smg") is not None
    require_or_skip(have, "sglang and smg are not installed in this Python", "PDSERVE_REQUIRE_PARSERS")


def test_reference_argv_accepted_by_both_real_parsers(parsers_available, reference):
    report = check_with_parsers(reference, sys.executable)
    assert report.skipped == []
    assert sorted(report.checked) == ["decode", "fallback", "prefill", "router"]
    assert report.problems == []


def test_stale_flag_is_rejected_and_named(parsers_available, reference_data):
    reference_data["decode"]["extra_args"] = ["--cuda-graph-max-bs", "64"]
    reference_data["router"]["extra_args"] = ["--tool-call-parser-typo", "x"]
    dep = deployment_from_data(reference_data, "t").deployment
    problems = {p.field: p for p in check_with_parsers(dep, sys.executable).problems}
    assert set(problems) == {"decode.extra_args", "router.extra_args"}
    assert problems["decode.extra_args"].value == "--cuda-graph-max-bs"
    assert "ambiguous option: --cuda-graph-max-bs" in problems["decode.extra_args"].message
    assert problems["router.extra_args"].value == "--tool-call-parser-typo"
    assert "unrecognized arguments" in problems["router.extra_args"].message


def _parse_router(args: list[str]) -> dict:
    """pdserve's parser check (launch/parse_check.py) on one router command line, in this Python."""
    from pdserve.launch import parse_check

    return parse_check.check({"role": "router", "program": "router", "args": args, "extra": 0})


def test_router_parser_names_are_smgs_own(parsers_available, reference):
    """smg takes --reasoning-parser / --tool-call-parser names from its Rust binary (argparse choices read from
    smg_rs): DeepSeek V4 is deepseek_v4 there, not SGLang's deepseekv4 / deepseek-v4 (0.3.2 exited on
    --tool-call-parser deepseekv4 at start). pdserve puts parsers on the SGLang servers, never the router
    (schema/rules.py); this holds what the real router would say if a parser name reached it."""
    from pdserve.render.argv import router_args

    base = router_args(reference)
    assert _parse_router(base)["status"] == "ok"
    assert _parse_router([*base, "--tool-call-parser", "deepseek_v4", "--reasoning-parser", "deepseek_v4"])[
        "status"] == "ok"
    for flag, name in (("--tool-call-parser", "bogus"), ("--tool-call-parser", "deepseekv4"),
                       ("--reasoning-parser", "deepseek-v4")):
        result = _parse_router([*base, flag, name])
        assert result["status"] == "error", (flag, name)
        assert f"argument {flag}: invalid choice: '{name}'" in result["detail"]
        assert "'deepseek_v4'" in result["detail"]  # the message lists smg's names


def test_check_command_runs_the_parsers(parsers_available):
    result = CliRunner().invoke(main, ["check", "--no-host", "--json", "--sglang-python", sys.executable])
    assert result.exit_code == 0, result.output
    assert "router argv accepted by the real parser" in result.output


def test_missing_sglang_python_is_a_stated_skip(reference):
    report = check_with_parsers(reference, "/nonexistent/python")
    assert report.problems == [] and report.checked == []
    assert report.skipped == ["parser check skipped: /nonexistent/python does not exist"]


def test_python_without_sglang_is_one_stated_skip_per_missing_package(reference, tmp_path):
    import venv

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    report = check_with_parsers(reference, str(bare / "bin" / "python"))
    assert report.problems == [] and report.checked == []
    assert len(report.skipped) == 2  # sglang for the three servers, smg for the router
    assert report.skipped[0].startswith("prefill, decode, fallback: parser not importable")
    assert "No module named 'smg'" in report.skipped[1]


def test_on_the_host_the_pinned_sglang_passes_and_its_parsers_run(parsers_available):
    # --host: the SGLang Python must hold the pins (issue 15); this venv's real sglang does.
    result = CliRunner().invoke(main, ["check", "--host", "--json", "--sglang-python", sys.executable])
    report = json.loads(result.stdout)
    assert report["host_checks"]["on"] is True
    assert [p for p in report["problems"] if p["field"] == "--sglang-python"] == []
    assert "--sglang-python has the pinned sglang and router (smg)" in report["checked"]
    assert "router argv accepted by the real parser" in report["checked"]
