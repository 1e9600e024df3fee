"""The router comparison benchmark's pure parts (tests/integration/router_compare): the 0.3.2 argv and
drop-in, held against sglang-router 0.3.2's own argument parser, and the table and record it prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pdserve.render.argv import launch
from pdserve.render.units import render_unit
from pdserve.schema.loading import deployment_from_data
from tests.integration.router_compare.legacy_router import (
    LEGACY_MODULE,
    REFUSED_BY_LEGACY,
    LegacyUnsupported,
    exec_start_of,
    legacy_dropin,
    legacy_exec_start,
    legacy_router_args,
)
from tests.integration.router_compare.report import FaultResult, TierResult, failure_figures, record, side_by_side
from tests.integration.router_compare.rounds import alternating

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from loadgen import Outcome

legacy_parser = pytest.importorskip("sglang_router.launch_router", reason="sglang-router 0.3.2 is not installed")


def rendered_router_argv(dep, tools) -> list[str]:
    return exec_start_of(render_unit(dep, launch(dep, "router", tools), "/etc/pdserve/dep.json", tools).text)


def test_the_rendered_smg_argv_is_refused_by_0_3_2_and_the_drop_ins_is_taken(reference, tools):
    rendered = rendered_router_argv(reference, tools)
    assert "--health-check-port" in rendered  # the reference sets one: 0.3.2 must do without it
    with pytest.raises(SystemExit):
        legacy_parser.parse_router_args(rendered[rendered.index("smg.launch_router") + 1:])

    argv = exec_start_of(legacy_dropin(rendered, reference))
    assert argv == legacy_exec_start(rendered, reference)
    assert argv[:3] == [tools.sglang_python, "-m", LEGACY_MODULE]
    parsed = legacy_parser.parse_router_args(argv[3:])
    parsed._validate_router_args()
    # pdserve's settings of then, and the deployment's servers and addresses.
    assert (parsed.retry_max_retries, parsed.retry_max_backoff_ms, parsed.health_check_interval_secs,
            parsed.health_success_threshold, parsed.disable_circuit_breaker) == (30, 2000, 2, 1, True)
    assert parsed.prefill_urls == [(f"http://127.0.0.1:{reference.prefill.port}", reference.transfer.bootstrap_port)]
    assert parsed.decode_urls == [f"http://127.0.0.1:{reference.decode.port}"]
    assert (parsed.host, parsed.port) == (reference.router.host, reference.router.port)


@pytest.mark.parametrize("flag", sorted(REFUSED_BY_LEGACY))
def test_each_flag_the_drop_in_leaves_out_is_one_0_3_2_refuses(flag):
    with pytest.raises(SystemExit):
        legacy_parser.parse_router_args(["--pd-disaggregation", "--prefill", "http://127.0.0.1:1", "--decode",
                                         "http://127.0.0.1:2", flag, "1"])


def test_the_drop_in_resets_exec_start_and_says_what_it_dropped_and_why(reference, tools):
    text = legacy_dropin(rendered_router_argv(reference, tools), reference)
    lines = text.splitlines()
    assert lines.count("ExecStart=") == 1 and lines.index("ExecStart=") < max(
        i for i, line in enumerate(lines) if line.startswith("ExecStart=/"))
    comment = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    assert "Dropped, since 0.3.2 refuses them: --health-check-port" in comment
    assert "--upstream-pool-idle-timeout-secs" in comment
    assert all(len(line) <= 120 for line in lines if line.startswith("#"))


def test_a_keyed_router_is_refused_naming_the_field(tools, reference_data):
    data = reference_data
    data["router"]["api_key_file"] = "/etc/pdserve/router.key"
    dep = deployment_from_data(data, "keyed").deployment
    with pytest.raises(LegacyUnsupported, match=r"router.api_key_file"):
        legacy_exec_start(rendered_router_argv(dep, tools), dep)


def test_the_legacy_args_keep_the_deployments_extra_router_flags(reference, reference_data):
    data = reference_data
    data["router"]["extra_args"] = ["--log-level", "debug"]
    assert legacy_router_args(deployment_from_data(data, "x").deployment)[-2:] == ["--log-level", "debug"]
    assert "--log-level" not in legacy_router_args(reference)


def outcome(start: float, seconds: float, cause: str = "ok", retry_after: str | None = None) -> Outcome:
    return Outcome(start, start + seconds, cause, "", retry_after)


def test_failure_figures_count_causes_retryable_503s_and_the_slowest():
    figures = failure_figures([outcome(0, 0.2), outcome(1, 0.05, "HTTP 503", "1"), outcome(2, 41.5, "HTTP 503"),
                               outcome(3, 30.0, "timeout"), outcome(4, 0.01, "HTTP 503", "1")])
    assert figures == {"failed": 4, "causes": {"HTTP 503": 3, "timeout": 1}, "retry_after_503": 2,
                       "slowest_failure_s": 41.5}
    assert failure_figures([outcome(0, 0.2)]) == {"failed": 0, "causes": {}, "retry_after_503": 0,
                                                  "slowest_failure_s": None}


def container_tier() -> TierResult:
    smg = {"sent": 400, "failed": 86, "causes": {"HTTP 503": 86}, "retry_after_503": 86, "slowest_failure_s": 0.15,
           "longest_refused_s": 0.0, "recovered_s": 4.3, "ready_again_s": 5.1, "note": "marked after 3.1 s " * 12}
    legacy = {"sent": 400, "failed": 0, "causes": {}, "retry_after_503": 0, "slowest_failure_s": None,
              "longest_refused_s": 0.0, "recovered_s": 0.0, "ready_again_s": 7.7}
    routers = {"smg": "smg 1.13.0", "old": "sglang-router 0.3.2"}
    tier = TierResult("container", "faults under load", ["20 req/s"], routers)
    tier.faults += [FaultResult("kill -9 prefill", {"smg": smg, "old": legacy}),
                    FaultResult("kill -9 router", {"smg": {"error": "ContainerError: timed out"}})]
    return tier


def test_the_table_puts_the_routers_side_by_side_one_line_per_measure():
    text = side_by_side(container_tier())
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("fault "))
    assert header.split("  ")[0] == "fault" and header.endswith("sglang-router 0.3.2")
    smg_at, old_at = header.index("smg 1.13.0"), header.index("sglang-router 0.3.2")
    row = next(line for line in lines if "failed (by cause)" in line)
    assert row.startswith("kill -9 prefill") is False and row[smg_at:].startswith("86 (86 HTTP 503)")
    assert row[old_at:] == "0"
    assert next(line for line in lines if "success again after role ready" in line)[smg_at:].startswith("-0.80 s")
    assert next(line for line in lines if "success again after the fault" in line)[old_at:] == "no failure"
    # The fault's name on its first measure only; a run that went wrong says so in every cell of its column,
    # a router that did not run it says that, and the error is in the notes.
    assert [line.split("  ")[0] for line in lines if line.startswith("kill")] == ["kill -9 prefill", "kill -9 router"]
    router_rows = lines[lines.index(next(line for line in lines if line.startswith("kill -9 router"))):]
    assert "error (see notes)" in router_rows[0] and router_rows[0].endswith("not run")
    assert "  kill -9 router, smg 1.13.0: ContainerError: timed out" in lines
    assert all(len(line) <= 120 for line in lines[lines.index("notes:"):])


def test_the_record_is_json_with_every_figure_and_the_runs_facts():
    meta = {"date": "2026-12-05T12:00:00+00:00", "hardware": "2 cores", "command": "python -m x", "commit": "abc"}
    loaded = json.loads(json.dumps(record(meta, [container_tier()])))
    assert loaded["schema_version"] == 1 and loaded["commit"] == "abc"
    faults = loaded["tiers"]["container"]["faults"]
    assert faults[0]["by_router"]["old"]["ready_again_s"] == 7.7
    assert loaded["tiers"]["container"]["routers"] == {"smg": "smg 1.13.0", "old": "sglang-router 0.3.2"}


def test_the_routers_alternate_in_order_and_a_run_that_raises_is_a_row_saying_so():
    ran: list[tuple[str, str]] = []
    recovered: list[str] = []

    def run(fault: str, router: str) -> dict:
        ran.append((fault, router))
        if (fault, router) == ("b", "old"):
            raise RuntimeError("the router never became ready")
        return {"failed": len(ran)}

    results = alternating(["a", "b", "c"], {"smg": "smg", "old": "0.3.2"}, run, lambda text: None,
                          lambda: recovered.append("reset"))
    assert ran == [("a", "smg"), ("a", "old"), ("b", "old"), ("b", "smg"), ("c", "smg"), ("c", "old")]
    assert [r.name for r in results] == ["a", "b", "c"]
    assert results[1].by_router == {"old": {"error": "RuntimeError: the router never became ready"},
                                    "smg": {"failed": 4}}
    assert recovered == ["reset"]
