"""kernels.<role> against a real systemd and journald (issue 16 item 4): the lines pdserve's SGLang plugin
writes from a unit's spawned processes are found by the unit's InvocationID, and a restart's lines are
read apart from the earlier invocation's. The writer is the plugin's own status module
(kernel_log_writer.py); the reader is pdserve.probes.journal.grep_invocation + pdserve.probes.kernel_log."""

from __future__ import annotations

from pathlib import Path

from pdserve.probes import journal, kernel_log
from pdserve.verify.checks.kernels import KernelsAsked, check_kernels
from tests.integration.systemd.container import wait_for

REPO = Path(__file__).resolve().parents[3]
UNIT = "pdserve-kernels-log"
CHOICE = "/var/lib/pdserve-kernels-log.choice"


def test_the_plugins_lines_of_the_current_invocation_are_read_back(container):
    box = container
    reader = ["nsenter", "-t", str(box.pid), "-a", "journalctl"]
    writer = str(Path(__file__).with_name("kernel_log_writer.py"))

    def current():
        state = box.systemctl.show([UNIT])[f"{UNIT}.service"]
        scan = journal.grep_invocation(state.invocation_id, kernel_log.MARK, timeout=30, command=reader) \
            if state.invocation_id else journal.InvocationScan(())
        log = kernel_log.parse(list(scan.lines))
        return (state, scan, log) if len(log.statuses) == 2 and log.fallbacks else None

    box.sh(f"echo pdserve > {CHOICE}")
    box.run(["systemd-run", f"--unit={UNIT}", "-p", "Type=exec", f"--setenv=PYTHONPATH={REPO / 'kernels' / 'python'}",
             box.env.python, writer, CHOICE])
    try:
        state, scan, log = wait_for(current, 60, "the writer's two statuses and its fallback")
        assert scan.incomplete is None and log.unreadable == ()
        assert sorted(s.tp_rank for s in log.statuses) == [0, 1]
        result = check_kernels(KernelsAsked("decode", UNIT, "pdserve", 2), state, log)
        assert result.status == "warn" and result.observed.startswith("pdserve's kernels on all 2 TP rank(s)")

        box.sh(f"echo sglang > {CHOICE}")
        box.run(["systemctl", "restart", f"{UNIT}.service"], timeout=60)
        again, scan, log = wait_for(lambda: (found := current()) and found[0].invocation_id != state.invocation_id
                                    and found, 60, "the restarted writer's lines")
        # Only the new invocation's lines: two statuses, both SGLang's, none of the first start's.
        assert [s.requested for s in log.statuses] == ["sglang", "sglang"]
        print(f"\ninvocation {state.invocation_id} -> {again.invocation_id}; the second's plugin lines:",
              *scan.lines, sep="\n  ")
        result = check_kernels(KernelsAsked("decode", UNIT, "pdserve", 2), again, log)
        assert result.status == "fail" and result.remediation.startswith(f"restart {UNIT}")
    finally:
        box.run(["systemctl", "stop", f"{UNIT}.service"], check=False)
        box.run(["systemctl", "reset-failed", f"{UNIT}.service"], check=False)
