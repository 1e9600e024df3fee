"""`pdserve bench`'s client run (issue 40): bounded by its deadline, ended with everything it started, and
its failure said in one line; a result file from an earlier run never passes for this one's. The client
here is a small Python script standing in for SGLang's (its real runs are the CPU tier's)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pdserve.bench import client


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "fake_client.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_a_client_past_its_deadline_is_ended_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    argv = script(tmp_path, f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open({str(pid_file)!r}, "w").write(str(child.pid))
time.sleep(60)
""")
    began = time.monotonic()
    run = client.run(argv, dict(os.environ), tmp_path / "r.jsonl", tmp_path / "log", deadline_s=2)
    assert time.monotonic() - began < 20
    assert run.returncode is None and "did not finish within 2 s" in run.problem
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_a_failing_client_is_named_by_its_last_line_and_an_old_result_does_not_count(tmp_path):
    result = tmp_path / "r.jsonl"
    result.write_text('{"completed": 99}\n')  # an earlier run's
    argv = script(tmp_path, "import sys\nprint('Traceback ...')\nprint('ValueError: Warmup failed')\nsys.exit(1)\n")
    run = client.run(argv, dict(os.environ), result, tmp_path / "log", deadline_s=30)
    assert run.returncode == 1 and run.result == b""
    assert run.problem == "the client exited 1: ValueError: Warmup failed"


def test_a_client_that_writes_its_result_returns_it(tmp_path):
    result = tmp_path / "r.jsonl"
    argv = script(tmp_path, f"open({str(result)!r}, 'a').write('{{\"completed\": 3}}\\n')\n")
    run = client.run(argv, dict(os.environ), result, tmp_path / "log", deadline_s=30)
    assert run.problem is None and run.result == b'{"completed": 3}\n'


def test_a_missing_client_is_a_problem_not_a_crash(tmp_path):
    run = client.run([str(tmp_path / "no-python")], {}, tmp_path / "r", tmp_path / "log", deadline_s=5)
    assert run.problem.startswith("cannot start the client")
