"""The cutover's edges: `systemctl show` parsing, the systemctl wrapper, refusal windows, and the command
line's exit codes (cgroup -> unit: test_probes_cgroups.py; the dry run: test_cutover_dry_run.py)."""

from __future__ import annotations

import itertools
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.cutover.refusals import PortProber, Sample, refusal_windows, summarize
from pdserve.probes.systemctl import Systemctl, SystemctlError, parse_show

SHOW = """\
MainPID=4711
Result=success
NRestarts=2
ExecMainStartTimestampMonotonic=769423417
ExecMainStatus=0
Id=sglang-t-prefill.service
LoadState=loaded
ActiveState=activating
SubState=start-post
UnitFileState=enabled
InactiveExitTimestampMonotonic=769423479
ActiveEnterTimestampMonotonic=0

MainPID=0
Result=exit-code
NRestarts=0
ExecMainStartTimestampMonotonic=0
ExecMainStatus=1
Id=nothere.service
LoadState=not-found
ActiveState=failed
SubState=failed
UnitFileState=
InactiveExitTimestampMonotonic=0
ActiveEnterTimestampMonotonic=0
"""


def test_parse_show_reads_each_block_by_id():
    states = parse_show(SHOW)
    prefill, missing = states["sglang-t-prefill.service"], states["nothere.service"]
    assert (prefill.active_state, prefill.sub_state, prefill.main_pid, prefill.n_restarts) == \
        ("activating", "start-post", 4711, 2)
    assert prefill.installed and prefill.enabled and prefill.running
    assert prefill.inactive_exit_us == 769423479 and prefill.active_enter_us == 0
    assert not missing.installed and not missing.enabled and not missing.running
    assert "result=exit-code" in missing.describe() and "exit status 1" in missing.describe()


def test_systemctl_show_asks_for_services_and_fills_in_missing_blocks():
    seen = []

    def runner(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, SHOW, "")

    states = Systemctl(["nsenter", "-t", "1", "systemctl"], runner=runner).show(["sglang-t-prefill", "other"])
    assert seen[0][:5] == ["nsenter", "-t", "1", "systemctl", "show"]
    assert seen[0][-2:] == ["sglang-t-prefill.service", "other.service"]
    assert states["other.service"].load_state == "not-found"


def test_systemctl_errors_carry_the_verb_and_stderr():
    def runner(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "Job for x.service failed.\nSee journalctl.\n")

    with pytest.raises(SystemctlError, match=r"systemctl start failed: Job for x.service failed. / See journalctl."):
        Systemctl(runner=runner).start(["x"])

    def slow(argv, timeout, **kw):
        raise subprocess.TimeoutExpired(argv, timeout)

    with pytest.raises(SystemctlError, match="no answer within 7 s"):
        Systemctl(runner=slow).stop(["x"], timeout=7)


def test_refusal_windows_run_from_first_refusal_to_next_accept():
    samples = [Sample(0.0, True), Sample(0.1, False), Sample(0.2, False), Sample(0.3, True),
               Sample(0.4, True), Sample(0.5, False), Sample(0.6, False)]
    assert refusal_windows(samples, end=0.9) == [(0.1, 0.3), (0.5, 0.9)]
    summary = summarize("127.0.0.1:1", samples, end=0.9)
    assert summary.refused_seconds == pytest.approx(0.6)
    assert summary.refused_samples == 4 and summary.samples == 7
    assert summarize("a", [Sample(0, True)], 1.0).refused_seconds == 0


def _within(seconds: float, condition) -> bool:
    """Poll `condition` until it holds or `seconds` have passed (a bounded wait, not a timing)."""
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


def test_prober_measures_a_real_closed_then_open_port():
    """A real socket, refused until a listener appears: every probe that ended before the listener was
    opened is refused, every probe begun after it is accepted, and the one window ends where that changes.
    Causes, not durations (a loaded 2-core machine stretches those): the timings are printed."""
    import socket
    import time

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    holder.close()  # nothing listens: connections are refused
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    before_start = time.monotonic()
    prober = PortProber("127.0.0.1", port, interval=0.05).start()
    after_start = time.monotonic()  # the prober's zero lies between before_start and after_start
    try:
        assert _within(10, lambda: len(prober.samples) >= 4), "the prober took no samples"
        opening = time.monotonic()
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        opened = time.monotonic()
        assert _within(10, lambda: sum(s.accepted for s in prober.samples) >= 3), "no probe got through"
    finally:
        summary = prober.stop()
        listener.close()
    samples = list(prober.samples)
    print(f"listener opened {opening - after_start:.3f}-{opened - before_start:.3f} s in; {summary}")
    # Probes run one after another: probe i has ended when probe i + 1 begins.
    ended_before = [s for s, following in itertools.pairwise(samples) if following.at + after_start < opening]
    begun_after = [s for s in samples if s.at + before_start > opened]
    assert ended_before and not any(s.accepted for s in ended_before), samples
    assert begun_after and all(s.accepted for s in begun_after), samples
    assert len(summary.windows) == 1 and summary.windows[0][0] == samples[0].at, summary
    first_accepted = next(s for s in samples if s.accepted)
    assert summary.windows[0][1] == first_accepted.at
    assert summary.refused_samples == sum(not s.accepted for s in samples) >= len(ended_before)


def test_cli_usage_exits_2_and_an_invalid_config_1(tmp_path: Path):
    # One exit-code table for every command (pdserve.cli.exits): a broken file is a problem, not usage.
    runner = CliRunner()
    assert runner.invoke(main, ["cutover", "sideways"]).exit_code == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "BAD NAME"\n')
    assert runner.invoke(main, ["cutover", "pd", "-c", str(bad)]).exit_code == 1


def test_cli_without_systemd_refuses_with_exit_1_and_json(tmp_path: Path):
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\necho 'Failed to connect to bus: Host is down' >&2\nexit 1\n")
    fake.chmod(0o755)
    result = CliRunner().invoke(main, ["cutover", "pd", "--json", "--systemctl", str(fake)])
    import json

    report = json.loads(result.output)
    assert result.exit_code == 1
    assert report["schema_version"] == 1 and report["outcome"] == "refused-by-preflight"
    assert "Host is down" in report["steps"][0]["detail"]
