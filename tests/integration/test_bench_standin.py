"""`pdserve bench` in the CPU tier (issue 40): SGLang 0.5.23's own benchmark client sends its requests
through the REAL router (smg 1.13.0, keyed) to the stand-in workers, with prompts drawn from a tokenizer
built here (tests/fixtures/tiny_tokenizer.py). The figures are the stand-ins' and are not checked; their
presence and consistency are, with the requests counted where they arrived, the KV hand-off read from the
prefill's metrics, the plot opened by Pillow, the history's change against the last run, a misbehaving
decode, and an interrupted run that keeps what it measured and leaves no client behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from bench_client import PKG, base_python, client_python, missing, tiny_workload
from pd_cluster import PDCluster, write_deployment
from tiny_tokenizer import write_tokenizer

from pdserve.bench.figures import ALL_FIGURES
from tests.conftest import require_or_skip

pytestmark = pytest.mark.integration

WORKLOADS = (tiny_workload("tiny", [4, 8], seed=7, slo_ttft_ms=5000, slo_tpot_ms=1000) + "\n"
             + tiny_workload("long", [8, 2], prompts=40))
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def bench_cluster():
    why = missing()
    require_or_skip(why is None, f"SGLang's benchmark client cannot run in {base_python()}: {why}",
                    "PDSERVE_REQUIRE_BENCH")
    # Where tests/conftest.py's visible_tmp_path makes its directories (pdserve refuses model and key paths
    # under /tmp), once for the module: the cluster serves every test here.
    parent = Path.home() / ".cache" / "pdserve-tests"
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=parent))
    model = write_tokenizer(directory / "model")
    key = directory / "router.key"
    key.write_text("bench-key\n")
    key.chmod(0o600)
    cluster = PDCluster(write_deployment(directory, model_path=str(model), api_key_file=str(key)), directory)
    (directory / "w.toml").write_text(WORKLOADS)
    client = client_python(directory / "client")
    try:
        cluster.serve(router_after_workers=True)
        yield cluster, directory, client
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


def bench_argv(directory: Path, client: Path, *extra: str) -> list[str]:
    return [base_python(), "-m", "pdserve.cli", "bench", "-c", str(directory / "deployment.toml"),
            "--workloads", str(directory / "w.toml"), "--sglang-python", str(client), *extra]


def run_bench(directory: Path, client: Path, *extra: str) -> tuple[int, dict, str]:
    done = subprocess.run(bench_argv(directory, client, "--json", *extra), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env={**os.environ, "PYTHONPATH": PKG}, check=False)
    return done.returncode, json.loads(done.stdout), done.stderr


def arrived(cluster: PDCluster) -> int:
    return cluster.logs("decode", tail=100_000).count("PD request arrived")


def test_bench_sends_the_clients_requests_through_the_keyed_router_and_reports_every_figure(bench_cluster):
    cluster, directory, client = bench_cluster
    before = arrived(cluster)
    history, plot = directory / "history.jsonl", directory / "sweep.png"
    code, report, stderr = run_bench(directory, client, "--workload", "tiny", "--history", str(history),
                                     "--plot", str(plot))
    assert code == 0, stderr
    assert "[serving 1/2] tiny: 4 req/s" in stderr and "8/8 done" in stderr  # progress as it runs
    (sweep,) = report["sweeps"]
    assert [p["value"] for p in sweep["points"]] == [4, 8]
    for point in sweep["points"]:
        assert point["failure"] is None and point["completed"] == 8 and point["errors"] == {}
        assert set(point["figures"]) == {f.key for f in ALL_FIGURES}, "a figure is missing"
        assert point["inconsistencies"] == []
        assert point["figures"]["kv_transfer_ms"] > 0  # from the prefill's sglang:kv_transfer_latency_ms
        assert point["figures"]["errors"] == 0 and point["figures"]["slo_attainment"] == 1.0
    # The client's requests arrived at the decode through the router (16, and its warm-up request per point).
    assert arrived(cluster) - before >= 16
    from PIL import Image

    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 500
    assert report["change"] == [f"no earlier run of workload tiny in {history}: this one is the baseline"]

    code, again, stderr = run_bench(directory, client, "--workload", "tiny", "--history", str(history))
    assert code == 0, stderr
    assert again["change"][0] == f"change against the run of {report['at']}:"
    assert any("TTFT p50 (ms)" in line and "%" in line for line in again["change"]), again["change"]
    assert len(history.read_text().splitlines()) == 2


def test_an_interrupted_run_keeps_what_it_measured_and_leaves_no_client(bench_cluster):
    _, directory, client = bench_cluster
    history = directory / "interrupted.jsonl"
    # Ctrl-C as a terminal sends it: SIGINT at its default, which a test run started in the background of a
    # non-interactive shell (`cmd &`) would otherwise pass down ignored, and then Python never raises
    # KeyboardInterrupt (seen 2026-12-07: the run went on to its end and exited 0).
    proc = subprocess.Popen(bench_argv(directory, client, "--workload", "long", "--json", "--history", str(history)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": PKG},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        for line in proc.stderr:  # wait until the second point runs (its 40 prompts at 2 req/s take 20 s)
            if line.startswith("[serving 2/2] long") or time.monotonic() > deadline:
                break
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1
    report = json.loads(out)
    (sweep,) = report["sweeps"]
    assert sweep["interrupted"] and [p["value"] for p in sweep["points"]] == [8]
    assert sweep["points"][0]["completed"] == 40
    (entry,) = [json.loads(line) for line in history.read_text().splitlines()]
    assert entry["sweeps"]["serving"]["interrupted"]
    left = subprocess.run(["pgrep", "-f", f"sglang.benchmark.serving.*{directory}"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert left.stdout == "", f"a client outlived the run: {left.stdout}"


def test_a_decode_that_fails_every_kv_transfer_is_found_by_the_smoke_chat_before_any_load(bench_cluster):
    # Last in the module: the router's breakers stay open a while after it.
    cluster, directory, client = bench_cluster
    before = arrived(cluster)
    cluster.set_faults("decode", faults=["kv_transfer_fails"])
    try:
        code, report, stderr = run_bench(directory, client, "--workload", "tiny")
    finally:
        cluster.reset_faults()
    assert code == 1, stderr
    assert report["sweeps"] == [] and not report["complete"]
    (note,) = report["notes"]
    assert note.startswith("nothing measured: the endpoint failed its smoke chat: chat completion"), note
    # The smoke chat's request (the router retries it, then opens its breakers); the client never started.
    assert arrived(cluster) > before
