"""The systemd tier's report as the table the README keeps: one row per figure, one column per router.

    python3 -m tests.gpu.systemd.table REPORT.json        # the run's report (systemd-run.json)
    python3 -m tests.gpu.systemd.table BENCH.json         # `pdserve bench --json`'s output, as its tables
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROWS = (
    ("requests sent / ok / failed", lambda r: f"{r['sent']} / {r['ok']} / {r['failed']}"),
    ("failed by cause", lambda r: ", ".join(f"{n} {c}" for c, n in r["failed_by_cause"].items()) or "none"),
    ("failed: in flight at the kill / sent after it / before it",
     lambda r: f"{r['failed_in_flight_at_kill']} / {r['failed_sent_after_kill']} / {r['failed_before_kill']}"),
    ("5xx answers with Retry-After", lambda r: f"{r['with_retry_after']} of {r['http_5xx']} "
                                               f"({', '.join(r['retry_after_values']) or '-'})"),
    ("failed requests answered within 1 s", lambda r: f"{r['answered_within_1s']} of {r['failed_after_kill']}"),
    ("failed request's wait, median / max", lambda r: f"{r['wait_s_median']} / {r['wait_s_max']} s"),
    ("longest refused window on the public port", lambda r: f"{r['longest_refused_s']} s"),
    ("kill -> first successful answer", lambda r: f"{r['first_successful_answer_after_kill_s']} s"),
    ("gate passed -> first successful answer", lambda r: f"{r['successful_answer_after_worker_ready_s']} s"),
    ("slowest success sent after the kill", lambda r: f"{r['slowest_success_sent_after_kill_s']} s"),
)


def render(report: dict) -> str:
    crash = report.get("prefill_kill_under_load")
    lines = []
    if "start" in report:
        lines.append(f"start of the router unit (pulls in prefill, then decode): exit {report['start']['exit']}, "
                     f"{report['start']['took_s']} s; process start -> gate: {report.get('ready_after_start_s')}")
    if "verify" in report:
        v = report["verify"]
        passed = sum(1 for s, _ in v["checks"].values() if s == "pass")
        lines.append(f"pdserve verify: exit {v['exit']}, {passed} of {len(v['checks'])} pass, failing {v['failing']}")
    if crash:
        lines.append(f"kill -9 of the prefill's main process {crash['killed_main_pid']} -> systemd started it again "
                     f"after {crash['kill_to_restart_s']} s, gate passed {crash['kill_to_gate_ready_s']} s after the "
                     f"kill ({crash['restart_to_gate_ready_s']} s from its start), NRestarts={crash['n_restarts']}")
        names = list(crash["routers"])
        width = max(len(name) for name, _ in ROWS)
        lines.append(f"{'':<{width}}  " + " | ".join(names))
        for name, cell in ROWS:
            values = []
            for router in names:
                try:
                    values.append(cell(crash["routers"][router]))
                except (KeyError, TypeError):
                    values.append("-")
            lines.append(f"{name:<{width}}  " + " | ".join(values))
    return "\n".join(lines)




def bench_sweeps(result: dict) -> list:
    """`pdserve bench --json`'s sweeps read back into pdserve's own types, so the record's table is printed by
    the same code that prints it on a host (pdserve.bench.table), not by a second formatter."""
    from pdserve.bench.figures import PointResult
    from pdserve.bench.sweep import Sweep
    from pdserve.bench.workload import Point

    return [Sweep(s["layout"], s["url"], [PointResult(Point(p["kind"], p["value"], p["prompts"]), p["figures"],
                                                      p["completed"], p["duration_s"], p["total_output_tokens"],
                                                      p["errors"], p["failure"]) for p in s["points"]],
                  s["notes"], s["interrupted"]) for s in result["sweeps"]]


def bench_text(result: dict) -> str:
    """The tables `pdserve bench` prints without --json: each layout's sweep, then side by side, then the notes."""
    from pdserve.bench import table as bench_table

    sweeps = bench_sweeps(result)
    lines = [line for sweep in sweeps for line in bench_table.sweep_lines(sweep)]
    if len(sweeps) > 1:
        lines += ["side by side (better: the layout ahead by more than 1%):", *bench_table.compare_lines(sweeps)]
    lines += [f"note: {note}" for note in result.get("notes", [])]
    return "\n".join(lines)


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text())
    print(bench_text(data) if "sweeps" in data else render(data))
