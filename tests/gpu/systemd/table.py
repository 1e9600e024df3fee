"""The systemd tier's report as the table the README keeps: one row per figure, one column per router.

    python3 -m tests.gpu.systemd.table REPORT.json
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


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
