"""`pdserve cutover` of a multi-host deployment: the order across hosts with the exact command per host,
one host's step through the same state machine with only that host's units, and the refusals (no
fallback to cut over to, no host named, a host that is not the deployment's)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdserve.cli.exits import Exit
from pdserve.cli.main import main
from pdserve.cutover.edge import Check
from pdserve.cutover.machine import Cutover
from pdserve.cutover.order import NO_FALLBACK, UnknownHost, order, order_lines, this_host
from pdserve.cutover.plan import plan_for
from pdserve.cutover.report import Outcome
from pdserve.probes.systemctl import UnitState
from pdserve.schema.loading import load
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import checks_for
from pdserve.verify.runner import select

REPO = Path(__file__).resolve().parents[2]
FOUR = REPO / "hosts" / "four-host" / "deployment.toml"
TWO = REPO / "hosts" / "two-host" / "deployment.toml"


@pytest.fixture
def four():
    return load(FOUR).deployment


def test_server_hosts_go_first_and_the_router_host_last(four):
    steps = order(four, "four.toml")
    assert [s.host for s in steps] == ["gpu-a", "gpu-b", "gpu-d", "gpu-c"]
    by_host = {s.host: s for s in steps}
    assert by_host["gpu-d"].workers == ("sglang-dsv4-decode-1-node1.service",) and by_host["gpu-d"].fronts == ()
    assert by_host["gpu-c"].workers == ("sglang-dsv4-decode-1.service",)
    assert by_host["gpu-c"].fronts == ("sglang-dsv4-router.service",)
    assert by_host["gpu-a"].cutover == "pdserve cutover pd -c four.toml --host gpu-a"
    assert by_host["gpu-c"].start == ("systemctl start sglang-dsv4-decode-1.service && "
                                      "systemctl start sglang-dsv4-router.service")
    # Stopping: the router before the server it proxies to.
    assert by_host["gpu-c"].stop == "systemctl stop sglang-dsv4-router.service sglang-dsv4-decode-1.service"


def test_the_printed_order_names_every_hosts_command(four):
    text = "\n".join(order_lines(four, "four.toml"))
    assert "1. at the same time on gpu-a, gpu-b, gpu-d" in text
    assert "on gpu-d (10.20.0.4): pdserve cutover pd -c four.toml --host gpu-d" in text
    assert text.index("--host gpu-d") < text.index("2. then on the router host") < text.index("--host gpu-c")


def test_one_hosts_plan_holds_only_its_units(four):
    plan = plan_for(four, "pd", host="gpu-c")
    assert plan.all_units == ("sglang-dsv4-decode-1.service", "sglang-dsv4-router.service")
    assert plan.units("single") == () and plan.gpus["pd"] == tuple(range(8))
    assert plan.public_url["pd"] == "http://10.20.0.3:30001"  # router.host 0.0.0.0: reached at gpu-c's address
    assert plan.smoke_checks == ("router.readiness", "router.workers", "e2e.chat")
    assert plan_for(four, "pd", host="gpu-a").smoke_checks == ("server.prefill-1",)
    assert plan_for(four, "pd", host="gpu-d").smoke_checks == ("units.decode-1-node1",)
    # Several routers: each router host's step smoke-tests its own router (the verifier's ids name the host).
    two_routers = four.model_copy(update={"router": four.router.model_copy(update={"hosts": ["gpu-c", "gpu-a"]})})
    assert plan_for(two_routers, "pd", host="gpu-a").smoke_checks == ("router.readiness.gpu-a", "router.workers.gpu-a",
                                                            "e2e.chat")
    assert plan_for(two_routers, "pd", host="gpu-a").fronts["pd"] == ("sglang-dsv4-router-gpu-a.service",)
    # Every smoke test names checks the verifier has for that host (select refuses an unknown id).
    for dep in (four, two_routers):
        for host in dep.hosts:
            registry = checks_for(expectations(dep, here=host))
            chosen = select(list(registry), list(plan_for(dep, "pd", host=host).smoke_checks), [])
            assert [i for i, reason in chosen.items() if reason is None]


def test_the_host_is_named_or_found_by_address_never_guessed(four):
    assert this_host(four, "gpu-b", []) == "gpu-b"
    assert this_host(four, None, ["192.168.0.9", "10.20.0.4"]) == "gpu-d"
    assert this_host(four, None, ["192.168.0.9"]) is None
    with pytest.raises(UnknownHost, match="its hosts are gpu-a, gpu-b, gpu-c, gpu-d"):
        this_host(four, "gpu-z", [])


class OneHost:
    """A host's systemd for the state machine: a unit starts and is active at once; every call recorded."""

    def __init__(self, installed):
        self.states = {u: UnitState(u, load_state="loaded", unit_file_state="disabled") for u in installed}
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.smoked: list[str] = []
        self.now = 0.0

    def show(self, units):
        return {u: self.states.get(u, UnitState(u, load_state="not-found")) for u in units}

    def start(self, units):
        self.calls.append(("start", tuple(units)))
        for u in units:
            self.states[u] = replace(self.states[u], active_state="active", sub_state="running")

    def stop(self, units, timeout):
        self.calls.append(("stop", tuple(units)))
        for u in units:
            self.states[u] = replace(self.states[u], active_state="inactive", sub_state="dead")

    def add_wants(self, target, units):
        self.calls.append(("add-wants", tuple(units)))

    def disable(self, units):
        self.calls.append(("disable", tuple(units)))

    def reset_failed(self, units):
        pass

    def unit_files(self, states):
        from pdserve.cutover.boot_links import UnitFiles
        return UnitFiles()

    def smoke(self, layout):
        self.smoked.append(layout)
        return Check(True, "smoke passed")

    def gpu_processes(self, gpus):
        return []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_hosts_step_starts_its_servers_then_its_router_and_touches_nothing_else(four):
    plan = plan_for(four, "pd", host="gpu-c")
    edge = OneHost(plan.all_units)
    report = Cutover(plan, edge).run()
    assert report.outcome is Outcome.SUCCESS, report.as_dict()
    assert [c for c in edge.calls if c[0] == "start"] == [("start", ("sglang-dsv4-decode-1.service",)),
                                                           ("start", ("sglang-dsv4-router.service",))]
    touched = {u for _, units in edge.calls for u in units}
    assert touched <= set(plan.all_units) and edge.smoked == ["pd"]


def test_another_hosts_units_are_not_installed_here_so_the_step_refuses(four):
    """gpu-a's step run on gpu-c (whose systemd has no prefill unit): refused at preflight, nothing started."""
    plan = plan_for(four, "pd", host="gpu-a")
    edge = OneHost(plan_for(four, "pd", host="gpu-c").all_units)
    report = Cutover(plan, edge).run()
    assert report.outcome is Outcome.REFUSED and not [c for c in edge.calls if c[0] == "start"]
    assert "not installed: sglang-dsv4-prefill-1.service" in report.steps[-1].detail


def fake_systemctl(tmp_path: Path) -> Path:
    """A systemctl that answers `show` with every unit loaded and stopped."""
    script = tmp_path / "systemctl"
    script.write_text('#!/bin/sh\n[ "$1" = show ] || exit 1\nfor arg; do case "$arg" in *.service) '
                      'printf "Id=%s\\nLoadState=loaded\\nActiveState=inactive\\nSubState=dead\\n\\n" "$arg";; esac; '
                      'done\n', encoding="utf-8")
    script.chmod(0o755)
    return script


def test_the_command_prints_the_order_and_refuses_without_a_host(tmp_path):
    runner = CliRunner()
    refused = runner.invoke(main, ["cutover", "pd", "-c", str(FOUR), "--systemctl", "false"])
    assert refused.exit_code == Exit.PROBLEMS
    assert "pass --host NAME (one of gpu-a, gpu-b, gpu-c, gpu-d)" in refused.output
    assert f"pdserve cutover pd -c {FOUR} --host gpu-c" in refused.output
    dry = runner.invoke(main, ["cutover", "pd", "-c", str(FOUR), "--dry-run", "--json"])
    data = json.loads(dry.stdout)
    assert dry.exit_code == 0 and data["outcome"] == "dry-run"
    assert [s["host"] for s in data["order"]] == ["gpu-a", "gpu-b", "gpu-d", "gpu-c"]
    # One host's dry run: its units only, and the host in the report.
    step = runner.invoke(main, ["cutover", "pd", "-c", str(FOUR), "--host", "gpu-d", "--dry-run", "--json",
                                "--systemctl", str(fake_systemctl(tmp_path))])
    data = json.loads(step.stdout)
    assert step.exit_code == 0 and data["host"] == "gpu-d" and data["outcome"] == "dry-run", step.output
    assert data["steps"][0]["detail"] == "sglang-dsv4-decode-1-node1.service"
    unknown = runner.invoke(main, ["cutover", "pd", "-c", str(FOUR), "--host", "gpu-z"])
    assert unknown.exit_code == Exit.USAGE and "its hosts are" in unknown.output


def test_there_is_no_single_layout_to_cut_over_to():
    result = CliRunner().invoke(main, ["cutover", "single", "-c", str(TWO)])
    assert result.exit_code == Exit.PROBLEMS and NO_FALLBACK in " ".join(result.output.split())


def test_a_single_host_file_takes_no_host():
    result = CliRunner().invoke(main, ["cutover", "pd", "--host", "gpu-a", "--dry-run"])
    assert result.exit_code == Exit.USAGE and "describes one host" in result.output
