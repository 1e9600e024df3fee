"""`pdserve bench --compare single,pd` against the container tier's deployment (issue 40): the rendered units
under a real systemd, the stand-in workers and the real router; the cutover drives the container's systemctl
(`--systemctl 'nsenter ... systemctl'`, as an operator's wrapper would) while SGLang's client runs on the host
(the container shares its network). Asserted: both layouts measured with the same workload, the KV hand-off
only where there is one, PD serving again at the end; and a single server whose start fails ends the run with
PD restored and the failure named.

The host's copy of the deployment differs from the units' in model.path only: the stand-in workers read nothing
there, and the client reads the tokenizer from a directory the host sees (tests/fixtures/tiny_tokenizer.py).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.integration.systemd.lab import CONFIG_PATH, SHORT_START_TIMEOUT_SEC

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from bench_client import PKG, base_python, client_python, missing, tiny_workload  # noqa: E402
from tiny_tokenizer import write_tokenizer  # noqa: E402

pytestmark = pytest.mark.integration

WORKLOAD = tiny_workload("tiny", [8], slo_ttft_ms=5000, slo_tpot_ms=1000)


@pytest.fixture
def host_side():
    why = missing()
    require_or_skip(why is None, f"SGLang's benchmark client cannot run in {base_python()}: {why}",
                    "PDSERVE_REQUIRE_BENCH")
    parent = Path.home() / ".cache" / "pdserve-tests"  # pdserve refuses model paths under /tmp
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=parent))
    try:
        write_tokenizer(directory / "model")
        (directory / "w.toml").write_text(WORKLOAD)
        yield directory, client_python(directory / "client")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def compare(lab, directory: Path, client: Path, data: dict) -> tuple[int, dict, str]:
    host_copy = copy.deepcopy(data)
    host_copy["model"]["path"] = str(directory / "model")
    config = directory / "deployment.json"
    config.write_text(json.dumps(host_copy))
    systemctl = shlex.join(lab.container.systemctl.command)
    done = subprocess.run([base_python(), "-m", "pdserve.cli", "bench", "-c", str(config), "--compare", "single,pd",
                           "--workloads", str(directory / "w.toml"), "--workload", "tiny", "--json",
                           "--sglang-python", str(client), "--systemctl", systemctl],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": PKG},
                          check=False)
    return done.returncode, json.loads(done.stdout), done.stderr


def serve_pd(lab) -> None:
    done = lab.pdserve("cutover", "pd", "-c", CONFIG_PATH, "--json")
    assert done.returncode == 0, done.stdout + done.stderr + lab.diagnostics()


def test_compare_measures_both_layouts_and_ends_with_pd_serving(lab, host_side):
    directory, client = host_side
    # The workers end a stop as SGLang 0.5.17 does, by SIGKILLing themselves: on the GPU tier (2026-12-06) that left
    # every stopped SGLang unit "failed" until the units took a SIGKILL as a clean end (unit_text.sigkill_ends).
    self_kill = {"PDSERVE_STANDIN_STOP_BY_SELF_SIGKILL": "1"}
    data = lab.variant(prefill_env=self_kill, decode_env=self_kill, fallback_env=self_kill)
    lab.install(data)
    serve_pd(lab)
    code, report, stderr = compare(lab, directory, client, data)
    assert code == 0, stderr + lab.diagnostics()
    assert report["compare"]["start"] == "pd" and report["restored"] and report["complete"]
    by_layout = {s["layout"]: s for s in report["sweeps"]}
    assert list(by_layout) == ["pd", "single"]  # the serving layout first: one cutover there, one back
    for layout, sweep in by_layout.items():
        (point,) = sweep["points"]
        assert point["completed"] == 8 and point["failure"] is None and point["inconsistencies"] == []
        assert ("kv_transfer_ms" in point["figures"]) == (layout == "pd")
    (point,) = report["compare"]["points"]
    ttft = point["figures"]["ttft_p50_ms"]
    assert ttft["better"] in ("pd", "single", "tie") and ttft["pd"] > 0 and ttft["single"] > 0, point
    assert point["figures"]["kv_transfer_ms"]["better"] == "-"  # a single server has no hand-off
    assert "restored pd, the layout that served at the start" in report["notes"]
    assert {lab.unit(r) for r in ("prefill", "decode", "router")} <= lab.active()
    assert lab.unit("fallback") not in lab.running()
    # Both cutovers stopped SGLang units that ended by SIGKILL: each stopped cleanly (the fallback at the way back,
    # the PD workers on the way there), none restarted for it, and verify's fallback check is not failed for it.
    fallback = lab.states()[lab.unit("fallback")]
    assert (fallback.active_state, fallback.result, fallback.n_restarts) == ("inactive", "success", 0), \
        lab.diagnostics()
    assert (fallback.exec_main_code, fallback.exec_main_status) == (2, 9), fallback  # CLD_KILLED by SIGKILL
    for role in ("fallback", "prefill", "decode"):
        assert "include_parent=True" in lab.container.journal(lab.unit(role), lines=400), role


def test_a_single_server_that_never_gets_ready_ends_the_compare_with_pd_restored(lab, host_side):
    directory, client = host_side
    data = lab.variant(fallback_env={"PDSERVE_STANDIN_NEVER_READY": "1"}, start_timeout=SHORT_START_TIMEOUT_SEC)
    lab.install(data)
    serve_pd(lab)
    code, report, stderr = compare(lab, directory, client, data)
    assert code == 1, stderr
    assert report["compare"]["failed_layout"] == "single" and report["restored"] and not report["complete"]
    assert [s["layout"] for s in report["sweeps"]] == ["pd"]
    failed = next(note for note in report["notes"] if note.startswith("the cutover to single failed"))
    assert "the cutover restored pd" in failed and "single unmeasured" in failed
    assert {lab.unit(r) for r in ("prefill", "decode", "router")} <= lab.active()
