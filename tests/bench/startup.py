"""How long pdserve's commands take to start: a table of wall-clock seconds per command line.

Each command runs REPEAT times as a fresh process (as a person or a unit's ExecStartPost= starts it), its
output thrown away; the table gives the fastest, the median and the slowest run, beside the bare interpreter's
start. The machine is described (CPU, cores, load average before and after), since a busy machine moves
every figure; compare trees on the same machine in one run with --tree (e.g. the main checkout's pkg/).

    PYTHONPATH=$PWD/pkg .venv/bin/python tests/bench/startup.py
    .venv/bin/python tests/bench/startup.py --tree new=$PWD/pkg --tree base=/path/to/other/checkout/pkg --repeat 20

Issue 42's target: `pdserve --help` within 0.2 s on an idle 2-core machine. A benchmark, not a test: it
prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

# (label, arguments after `python`): what is timed. plan and check read the embedded reference deployment.
COMMANDS = [
    ("python (interpreter only)", ["-c", "pass"]),
    ("pdserve --help", ["-m", "pdserve.cli.main", "--help"]),
    ("pdserve --version", ["-m", "pdserve.cli.main", "--version"]),
    ("pdserve plan --help", ["-m", "pdserve.cli.main", "plan", "--help"]),
    ("pdserve plan (piped)", ["-m", "pdserve.cli.main", "plan"]),
    ("pdserve plan --json", ["-m", "pdserve.cli.main", "plan", "--json"]),
    ("pdserve check --no-host --no-parsers", ["-m", "pdserve.cli.main", "check", "--no-host", "--no-parsers"]),
    ("pdserve verify --list", ["-m", "pdserve.cli.main", "verify", "--list"]),
]
RUN_TIMEOUT_S = 60


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _time_once(python: str, args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([python, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          timeout=RUN_TIMEOUT_S, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10, help="runs per command line (default 10)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PKG_DIR",
                    help="time pdserve from this pkg/ directory (PYTHONPATH); repeatable. Default: the current "
                         "PYTHONPATH, named 'this'")
    ap.add_argument("--python", default=sys.executable, help="the Python to run (default: this one)")
    opts = ap.parse_args()
    trees = [tuple(t.split("=", 1)) for t in opts.tree] or [("this", os.environ.get("PYTHONPATH", ""))]

    print(f"# pdserve startup, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"# {_cpu()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()} ({opts.python})")
    print(f"# load average before: {_load()}; {opts.repeat} runs per line, seconds of wall clock")
    header = f"{'command':<40} {'tree':<8} {'min':>7} {'median':>7} {'max':>7}"
    print(header)
    print("-" * len(header))
    envs = {name: {**os.environ, "PYTHONPATH": pkg} for name, pkg in trees}
    for label, args in COMMANDS:
        runs: dict[str, list[float]] = {name: [] for name in envs}
        for env in envs.values():  # a warm-up each: the file cache is warm for every tree alike
            _time_once(opts.python, args, env)
        # The trees take turns, so a burst of load elsewhere on the machine falls on each of them alike.
        for _ in range(opts.repeat):
            for name, env in envs.items():
                runs[name].append(_time_once(opts.python, args, env))
        for name, times in runs.items():
            times.sort()
            print(f"{label:<40} {name:<8} {times[0]:>7.3f} {statistics.median(times):>7.3f} {times[-1]:>7.3f}")
    print(f"# load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
