"""`pdserve bench --compare` (issue 40): each layout measured in turn, and the layout that served at the
start restored whatever happens: after the last layout, after a cutover (its smoke test) failed, after
Ctrl-C in a sweep or in a cutover. The cutover and the client are fakes here that fail on cue; the real
ones are driven by the command (pdserve.bench.runs)."""

from __future__ import annotations

import pytest

from pdserve.bench.layouts import Switched, compare, parse_layouts
from pdserve.bench.sweep import Sweep


class Host:
    """A host that serves one layout at a time; `fail` names cutover targets that fail (and roll back)."""

    def __init__(self, start, fail=(), rollback_fails=False, interrupt_in=None):
        self.serving, self.fail, self.rollback_fails = start, set(fail), rollback_fails
        self.interrupt_in, self.switches, self.measured = interrupt_in, [], []

    def switch(self, layout):
        self.switches.append(layout)
        if layout in self.fail:
            if self.rollback_fails:
                self.serving = None
            return Switched(layout, False, self.serving, "failed-rolled-back at smoke test: chat failed")
        self.serving = layout
        return Switched(layout, True, layout)

    def measure(self, layout):
        assert self.serving == layout, "measured a layout that does not serve"
        self.measured.append(layout)
        if self.interrupt_in == layout:
            raise KeyboardInterrupt
        return Sweep(layout, "http://x")


@pytest.mark.parametrize("start", ["pd", "single"])
def test_the_serving_layout_is_measured_first_and_restored_at_the_end(start):
    host = Host(start)
    done = compare(("single", "pd"), start, host.switch, host.measure)
    other = "single" if start == "pd" else "pd"
    assert host.measured == [start, other] and host.switches == [other, start]
    assert host.serving == start and done.restored and done.complete
    assert "restored " + start in done.notes[-1]


def test_a_layout_whose_cutover_fails_ends_the_run_with_the_start_layout_serving_and_says_so():
    host = Host("pd", fail={"single"})
    done = compare(("single", "pd"), "pd", host.switch, host.measure)
    assert host.measured == ["pd"] and host.switches == ["single"] and host.serving == "pd"
    assert done.failed_layout == "single" and not done.complete and done.restored
    assert "the cutover to single failed" in done.notes[0] and "restored pd" in done.notes[0]


def test_ctrl_c_in_a_sweep_keeps_what_was_measured_and_switches_back():
    host = Host("pd", interrupt_in="single")
    done = compare(("single", "pd"), "pd", host.switch, host.measure)
    assert [s.layout for s in done.sweeps] == ["pd"] and done.interrupted
    assert host.serving == "pd" and host.switches == ["single", "pd"] and done.restored


def test_a_failed_way_back_is_reported_as_not_restored_with_the_command_to_run():
    host = Host("pd")
    host.fail = set()

    def switch(layout):
        if layout == "pd":  # the way back fails
            return Switched("pd", False, None, "rollback-failed")
        return host.switch(layout)

    done = compare(("single", "pd"), "pd", switch, host.measure)
    assert not done.restored and not done.complete
    assert "pdserve cutover pd" in done.notes[-1]


def test_when_the_cutovers_rollback_fails_too_the_way_back_is_still_tried():
    host = Host("pd", fail={"single"}, rollback_fails=True)
    done = compare(("single", "pd"), "pd", host.switch, host.measure)
    assert host.switches == ["single", "pd"] and host.serving == "pd" and done.restored
    assert "rollback failed too" in done.notes[0]


@pytest.mark.parametrize(("text", "ok"), [("single,pd", True), ("pd, single", True), ("pd", False),
                                          ("pd,pd", False), ("pd,fallback", False), ("", False)])
def test_layouts_are_parsed_strictly(text, ok):
    layouts, why = parse_layouts(text)
    assert bool(layouts) == ok and (why is None) == ok
