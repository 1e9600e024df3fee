"""`pdserve bench`'s edges (issue 40): the client's command line carries no secret and fetches nothing;
the KV hand-off time is the prefill histogram's change over the point, or nothing; every refusal comes
before any request (a listener on the router's port counts the connections: none)."""

from __future__ import annotations

import shlex
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.bench import client, client_argv, kv_transfer
from pdserve.bench.workload import read_workload
from pdserve.cli.exits import Exit
from pdserve.cli.main import main
from pdserve.probes.metrics import MetricsObs, parse

WORKLOAD, _ = read_workload("w", {"input_len": 8, "output_len": 4, "concurrencies": [2], "prompts": 4,
                                  "slo_e2e_ms": 900})


def test_the_client_argv_has_no_key_and_names_an_offline_dataset():
    argv = client_argv.argv("/opt/sg/bin/python", WORKLOAD, WORKLOAD.points()[0], "http://127.0.0.1:30001",
                            "dsv4", "/models/dsv4", "/tmp/out.jsonl")
    assert argv[:3] == ["/opt/sg/bin/python", "-m", "sglang.benchmark.serving"]
    joined = " ".join(argv)
    assert "--dataset-name=random-ids" in argv and "--max-concurrency=2" in argv
    assert "--goodput ttft:1000.0 tpot:100.0 e2el:900.0" in joined and "--tokenizer=/models/dsv4" in argv
    env = client_argv.environment({"OPENAI_API_KEY": "someone-elses", "PATH": "/bin"}, "k3y")
    assert env["OPENAI_API_KEY"] == "k3y" and env["HF_HUB_OFFLINE"] == "1" and "k3y" not in joined
    assert "OPENAI_API_KEY" not in client_argv.environment({"OPENAI_API_KEY": "x"}, None)


def prefill(total_ms: float, count: float) -> MetricsObs:
    name = "sglang:kv_transfer_latency_ms"
    return parse("http://p/metrics", f'{name}_sum{{engine_type="prefill"}} {total_ms}\n'
                                     f'{name}_count{{engine_type="prefill"}} {count}\n')


@pytest.mark.parametrize(("before", "after", "mean"), [
    ([prefill(100, 10)], [prefill(160, 16)], 10.0),
    ([prefill(100, 10), prefill(0, 0)], [prefill(100, 10), prefill(30, 2)], 15.0),  # two prefill servers
    ([prefill(100, 10)], [prefill(100, 10)], None),  # no transfer during the point
    ([prefill(100, 10)], [prefill(5, 1)], None),  # a server restarted: its counters went back
    ([MetricsObs("http://p/metrics", None, error="refused")], [prefill(1, 1)], None),
    ([parse("http://p/metrics", "sglang:num_running_reqs 0\n")], [parse("http://p/metrics", "x 1\n")], None),
])
def test_kv_transfer_time_is_the_histograms_change_or_nothing(before, after, mean):
    assert kv_transfer.mean_ms(before, after) == mean


class Listener:
    """A TCP port that counts who connects (and answers nothing)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port, self.connections, self.done = self.sock.getsockname()[1], 0, False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.done:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.done = True
        self.thread.join(5)
        self.sock.close()


def deployment(directory: Path, port: int, model: Path, context: int = 4096) -> Path:
    path = directory / "deployment.toml"
    path.write_text(f'''name = "b"
[model]
path = "{model}"
served_name = "m"
context_length = {context}
[prefill]
gpus = [0]
port = 30100
[decode]
gpus = [1]
port = 30102
[router]
host = "127.0.0.1"
port = {port}
[fallback]
gpus = [0, 1]
''')
    return path


@pytest.mark.parametrize(("workload", "tokenizer", "words"), [
    ('input_len = 4000\noutput_len = 200\nrequest_rates = [1]\nprompts = 2', True,
     "error: workloads.w.input_len = 4000: input_len + output_len = 4200 tokens is longer than the context length"),
    ('input_len = 8\noutput_len = 8\nrequest_rates = [0]\nprompts = 2', True,
     "error: workloads.w.request_rates = [0]: a rate of 0 sends nothing"),
    ('input_len = 8\noutput_len = 8\nrequest_rates = [1]\nprompts = 2', False, "holds no tokenizer"),
])
def test_bad_input_is_refused_before_any_request(visible_tmp_path, workload, tokenizer, words):
    model = visible_tmp_path / "model"
    model.mkdir()
    if tokenizer:
        (model / "tokenizer.json").write_text("{}")
    (visible_tmp_path / "w.toml").write_text(f"[workloads.w]\n{workload}\n")
    listener = Listener()
    try:
        config = deployment(visible_tmp_path, listener.port, model)
        result = CliRunner().invoke(main, ["bench", "-c", str(config), "--workloads", str(visible_tmp_path / "w.toml"),
                                           "--workload", "w", "--sglang-python", "/opt/sg/bin/python"])
    finally:
        listener.close()
    assert result.exit_code == Exit.PROBLEMS, result.output
    assert words in result.output and "fix:" in result.output
    assert listener.connections == 0


def test_an_unreadable_workloads_file_and_a_missing_client_python_are_refused(visible_tmp_path):
    model = visible_tmp_path / "model"
    model.mkdir()
    (visible_tmp_path / "w.toml").write_text("[workloads.w\n")
    config = deployment(visible_tmp_path, 9, model)
    result = CliRunner().invoke(main, ["bench", "-c", str(config), "--workloads", str(visible_tmp_path / "w.toml")])
    assert result.exit_code == Exit.PROBLEMS
    assert "--workloads" in result.output and "is not TOML" in result.output
    assert "tools.sglang_python" in result.output


def test_a_history_or_plot_path_that_cannot_be_written_is_refused_before_any_request(visible_tmp_path):
    model = visible_tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    listener = Listener()
    try:
        config = deployment(visible_tmp_path, listener.port, model)
        result = CliRunner().invoke(main, ["bench", "-c", str(config), "--workload", "smoke", "--sglang-python",
                                           "/opt/sg/bin/python", "--history", str(visible_tmp_path / "no" / "h.jsonl"),
                                           "--plot", str(visible_tmp_path / "nor" / "p.png")])
    finally:
        listener.close()
    assert result.exit_code == Exit.PROBLEMS, result.output
    assert "error: --history = " in result.output and "does not exist" in result.output
    assert "error: --plot = " in result.output
    assert listener.connections == 0


def _client(tmp_path, name: str, help_text: str, code: int = 0) -> str:
    """A stand-in client Python whose `-m MODULE --help` prints `help_text` (what an older SGLang lists)."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(help_text)}\nexit {code}\n", encoding="utf-8")
    script.chmod(0o755)
    return str(script)


def test_a_client_without_goodput_is_run_without_it_and_says_so(tmp_path):
    old = _client(tmp_path, "old", "usage: serving.py [--seed SEED] [--request-rate REQUEST_RATE]")
    assert client.accepts_option(old, client_argv.MODULE, "--goodput", {}) is False
    argv = client_argv.argv(old, WORKLOAD, WORKLOAD.points()[0], "http://r", "m", "/t", "/o", goodput=False)
    assert "--goodput" not in argv and not any(a.startswith("ttft:") for a in argv)
    new = _client(tmp_path, "new", "usage: serving.py [--goodput KEY:VALUE [KEY:VALUE ...]]")
    assert client.accepts_option(new, client_argv.MODULE, "--goodput", {}) is True
    # A client that cannot say (a failing --help) keeps the option: its own run then names the problem.
    broken = _client(tmp_path, "broken", "Traceback: ImportError", code=1)
    assert client.accepts_option(broken, client_argv.MODULE, "--goodput", {}) is None
