"""`pdserve verify` on a multi-host deployment: one check per server process, the host-local ones made
only on their own host (elsewhere a skip naming the host and the command to run there), the network
ones (the router, /server_info, /metrics) made from wherever verify runs; which host a run stands on."""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.probes.observations import HttpObs, PortProbe
from pdserve.probes.systemctl import Systemctl
from pdserve.schema.loading import deployment_from_data
from pdserve.verify import context, runner
from pdserve.verify.checks import exposure, router
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import HostChoiceError, checks_for, choose_host
from pdserve.verify.result import Status


def two_hosts(reference_data: dict[str, Any], router_host: str = "10.0.0.1") -> dict[str, Any]:
    """The reference model on two hosts: prefill on a, decode on b, a second decode spanning a and b
    (multi-node TP: node 0 on a), the router on a."""
    data = copy.deepcopy(reference_data)
    for key in ("prefill", "decode", "fallback"):
        data.pop(key)
    data["hosts"] = {"node-a": {"address": "10.0.0.1", "gpus": 8}, "node-b": {"address": "10.0.0.2", "gpus": 8}}
    data["prefill"] = [{"hosts": ["node-a"], "gpus": [0, 1, 2, 3], "port": 30000, "numa_node": 0}]
    data["decode"] = [
        {"hosts": ["node-b"], "gpus": [0, 1, 2, 3], "port": 30002},
        {"name": "decode-wide", "hosts": ["node-a", "node-b"], "gpus": [4, 5, 6, 7], "port": 30004,
         "dist_init_port": 30100},
    ]
    data["router"].update({"hosts": ["node-a"], "host": router_host})
    return data


@pytest.fixture
def dep(reference_data):
    return deployment_from_data(two_hosts(reference_data), "<two hosts>").deployment


# --- which checks exist -------------------------------------------------------------------------------

def test_a_single_host_file_keeps_its_check_ids(reference):
    """A single-host file is a one-host deployment: one check per role, no host in any id, in this order."""
    assert list(checks_for(expectations(reference))) == [
        "units.prefill", "units.decode", "units.router", "units.fallback", "router.readiness", "router.workers",
        "kv.prefill", "kv.decode", "server.prefill", "server.decode", "gpu.memory", "gpu.processes",
        "numa.prefill", "numa.decode", "e2e.chat", "e2e.reasoning", "e2e.tools", "e2e.stream",
        "metrics.prefill", "metrics.decode", "metrics.router", "metrics.kv_transfer", "metrics.router_requests",
        "exposure.ports", "exposure.auth", "versions.prefill", "versions.decode", "versions.router",
        "kernels.prefill", "kernels.decode", "kernels.fallback"]


def test_every_server_process_gets_its_checks_and_every_host_its_own(dep):
    ids = list(checks_for(expectations(dep, here="node-a")))
    assert [i for i in ids if i.startswith("units.")] == [
        "units.prefill-1", "units.decode-1", "units.decode-wide", "units.decode-wide-node1", "units.router"]
    # HTTP checks only for node 0 of each server: node 1 of decode-wide serves no API.
    assert [i for i in ids if i.startswith("kv.")] == ["kv.prefill-1", "kv.decode-1", "kv.decode-wide"]
    assert [i for i in ids if i.startswith("numa.")] == [
        "numa.prefill-1", "numa.decode-1", "numa.decode-wide", "numa.decode-wide-node1"]
    assert {i for i in ids if i.startswith(("gpu.", "exposure.ports"))} == {
        "gpu.memory.node-a", "gpu.memory.node-b", "gpu.processes.node-a", "gpu.processes.node-b",
        "exposure.ports.node-a", "exposure.ports.node-b"}
    assert "units.fallback" not in ids  # a multi-host file has no fallback
    # The comparing checks still come after every end-to-end one (they read a baseline taken before it).
    last_e2e = max(ids.index(i) for i in ids if i.startswith("e2e."))
    assert all(ids.index(i) > last_e2e for i in runner.BEFORE_AND_AFTER_E2E)


def test_servers_are_reached_at_their_cluster_address(dep):
    exp = expectations(dep, here="node-b")
    assert {k: w.url for k, w in exp.servers.items()} == {
        "prefill-1": "http://10.0.0.1:30000", "decode-1": "http://10.0.0.2:30002", "decode-wide": "http://10.0.0.1:30004"}
    assert exp.workers["decode-wide-node1"].on_host == "node-b" and exp.workers["decode-wide-node1"].rank == 1
    assert exp.router_url == "http://10.0.0.1:30001" and exp.router_on == "node-a"
    # The router's Prometheus listener is on loopback: from node-b it is not read at all.
    assert "router" not in exp.metrics_urls
    assert expectations(dep, here="node-a").metrics_urls["router"] == "http://127.0.0.1:29000/metrics"


# --- running them from one host -------------------------------------------------------------------------

def show_active(argv, **kwargs):
    unit = argv[-1]
    return subprocess.CompletedProcess(argv, 0, f"Id={unit}\nLoadState=loaded\nActiveState=active\nSubState=running\n"
                                       "UnitFileState=enabled\n", "")


def run_from(dep, here: str, only: list[str], handler, monkeypatch, systemctl=show_active):
    monkeypatch.setattr(context, "unavailable_reason", lambda: None)
    exp = expectations(dep, here=here)
    checks = checks_for(exp)
    options = runner.Options(probe_timeout=1, rerun="pdserve verify -c two.toml")
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        ctx = runner.Context(dep, exp, options, client, Systemctl(runner=systemctl), here=here)
        results, broken = runner.run(ctx, runner.select(list(checks), only, []), checks=checks)
    assert broken == []
    return {r.id: r for r in results if not r.observed.startswith("skipped: not selected")}


def refuse(request):
    raise httpx.ConnectError("refused", request=request)


def test_another_hosts_local_checks_say_where_to_run_them(dep, monkeypatch):
    results = run_from(dep, "node-a", ["units", "numa.decode-1", "gpu.memory.node-b", "exposure.ports.node-b"],
                       refuse, monkeypatch)
    assert results["units.prefill-1"].status is Status.PASS  # node-a's own unit: systemd was asked
    assert results["units.router"].status is Status.PASS and results["units.decode-wide"].status is Status.PASS
    for check_id in ("units.decode-1", "units.decode-wide-node1", "numa.decode-1", "gpu.memory.node-b",
                     "exposure.ports.node-b"):
        result = results[check_id]
        assert result.status is Status.SKIP, result
        assert result.observed.startswith("skipped: host-local:") and "on host node-b" in result.observed
        assert "run `pdserve verify -c two.toml --host node-b` on node-b" in result.observed


def test_the_routers_host_is_named_from_a_worker_host(dep, monkeypatch):
    asked: list[str] = []

    def systemctl(argv, **kwargs):
        asked.append(argv[-1])
        return show_active(argv)

    results = run_from(dep, "node-b", ["units", "versions.router", "metrics.router"], refuse, monkeypatch, systemctl)
    assert sorted(asked) == ["sglang-dsv4-decode-1.service", "sglang-dsv4-decode-wide-node1.service"]
    for check_id in ("units.router", "versions.router", "metrics.router", "units.prefill-1"):
        assert "--host node-a` on node-a" in results[check_id].observed, results[check_id]


def test_the_router_is_checked_from_a_router_host_and_skipped_where_the_firewall_blocks(dep, monkeypatch):
    """router.readiness / router.workers also read every server's /health, and the rendered firewall opens
    the servers' ports only to their own host and the router hosts: from the router's host node-a they run
    over the cluster network (the router must list all three servers with the prefill's bootstrap port);
    from the worker host node-b they would time out on a healthy cluster, so they skip, naming node-a."""
    seen: list[str] = []
    workers = [{"url": "http://10.0.0.1:30000", "worker_type": "prefill", "bootstrap_port": 8998, "is_healthy": True},
               {"url": "http://10.0.0.2:30002", "worker_type": "decode", "is_healthy": True},
               {"url": "http://10.0.0.1:30004", "worker_type": "decode", "is_healthy": True}]

    def handler(request):
        seen.append(str(request.url))
        if request.url.path == "/readiness":
            return httpx.Response(200, json={"status": "ready", "healthy_workers": 3, "total_workers": 3})
        if request.url.path == "/workers":
            return httpx.Response(200, json={"workers": workers})
        return httpx.Response(200, json={})

    results = run_from(dep, "node-a", ["router"], handler, monkeypatch)
    assert results["router.readiness"].status is Status.PASS, results["router.readiness"]
    assert results["router.workers"].status is Status.PASS, results["router.workers"]
    assert "http://10.0.0.1:30001/readiness" in seen and "http://10.0.0.2:30002/health" in seen
    blocked = run_from(dep, "node-b", ["router", "kv.", "server.", "metrics.kv_transfer"], refuse, monkeypatch)
    remote = {k: v for k, v in blocked.items() if k.startswith(("router.", "metrics.kv_transfer"))
              or (k.startswith(("kv.", "server.")) and "decode-1" not in k)}
    assert remote and all(v.status is Status.SKIP and "--host node-a" in v.observed for v in remote.values()), remote


def test_a_router_on_loopback_is_checked_on_its_own_host_only(reference_data, monkeypatch):
    dep = deployment_from_data(two_hosts(reference_data, router_host="127.0.0.1"), "t").deployment
    results = run_from(dep, "node-b", ["router.readiness", "e2e.chat"], refuse, monkeypatch)
    for result in results.values():
        assert result.status is Status.SKIP and "the router's API on loopback" in result.observed, result


def test_several_routers_are_each_checked(reference_data, monkeypatch):
    """Routers on both hosts, each a full view: each gets its unit, readiness, workers and version checks
    (ids by host), made through its own address; the end-to-end checks go through this host's router."""
    data = two_hosts(reference_data, router_host="0.0.0.0")
    data["router"]["hosts"] = ["node-a", "node-b"]
    dep = deployment_from_data(data, "t").deployment
    asked, seen = [], []

    def systemctl(argv, **kwargs):
        asked.append(argv[-1])
        return show_active(argv)

    def handler(request):
        seen.append(str(request.url))
        return httpx.Response(200, json={"status": "ready", "healthy_workers": 3, "total_workers": 3})

    results = run_from(dep, "node-b", ["units.router", "router.readiness", "versions.router"], handler, monkeypatch,
                       systemctl)
    assert set(results) == {"units.router.node-a", "units.router.node-b", "router.readiness.node-a",
                            "router.readiness.node-b", "versions.router.node-a", "versions.router.node-b"}
    assert set(asked) == {"sglang-dsv4-router-node-b.service"}  # node-a's router unit is node-a's to read
    assert "--host node-a` on node-a" in results["units.router.node-a"].observed
    assert results["units.router.node-b"].status is Status.PASS
    assert {"http://10.0.0.1:30001/readiness", "http://10.0.0.2:30001/readiness"} <= set(seen)
    assert expectations(dep, here="node-b").router_url == "http://10.0.0.2:30001"


def test_a_multi_node_servers_kernels_are_judged_per_node_on_its_own_ranks(reference_data, monkeypatch):
    """decode-wide is TP8 over two nodes: node 1 (on node-b) logs ranks 4-7, and only those are asked of it."""
    from pdserve.probes import journal, kernel_log
    from pdserve.verify.checks import kernels

    data = two_hosts(reference_data)
    data["decode"][1]["attention_kernels"] = "pdserve"
    dep = deployment_from_data(data, "t").deployment
    asked: list = []
    monkeypatch.setattr(kernels, "check_kernels", lambda a, *rest: asked.append(a) or kernels.skipped("x", "y"))
    monkeypatch.setattr(journal, "grep_invocation", lambda *a, **k: journal.InvocationScan(()))
    monkeypatch.setattr(kernel_log, "parse", lambda lines: None)
    run_from(dep, "node-b", ["kernels.decode-wide-node1"], refuse, monkeypatch)
    (node1,) = asked
    assert (node1.unit, list(node1.ranks)) == ("sglang-dsv4-decode-wide-node1", [4, 5, 6, 7])


def test_kv_capacity_of_a_remote_server_does_not_read_this_hosts_journal(dep, monkeypatch):
    """/server_info answers over the network; the journal fallback is the server's host's, never this one's
    (the same unit name here would be another process, or none)."""
    grepped: list[str] = []
    monkeypatch.setattr(context.journal, "grep_journal", lambda unit, needle, timeout: grepped.append(unit) or [])
    results = run_from(dep, "node-a", ["kv"], lambda request: httpx.Response(200, json={}), monkeypatch)
    assert grepped == ["sglang-dsv4-prefill-1", "sglang-dsv4-decode-wide"]  # node-a's servers only
    assert results["kv.decode-1"].status is Status.FAIL
    assert ("its journal is on host node-b (`pdserve verify --host node-b` there reads it)"
            in results["kv.decode-1"].observed)


def test_router_workers_names_a_missing_server(dep):
    exp = expectations(dep, here="node-a")
    listed = HttpObs("http://10.0.0.1:30001/workers", 200, {"workers": [
        {"url": "http://10.0.0.1:30000", "worker_type": "prefill", "bootstrap_port": 8998, "is_healthy": True},
        {"url": "http://10.0.0.2:30002", "worker_type": "decode", "is_healthy": True}]})
    result = router.check_workers(exp, listed)
    assert result.status is Status.FAIL and "decode http://10.0.0.1:30004 is not registered" in result.details


def test_cluster_listeners_are_expected_on_the_cluster_address_only(dep):
    here = expectations(dep, here="node-b")
    local = replace(here, workers=here.on("node-b"))
    on_cluster = PortProbe("10.0.0.2", 30002, "decode-1 port", True)
    assert exposure.check_ports(local, ["10.0.0.2"], [on_cluster], []).status is Status.PASS
    elsewhere = PortProbe("192.168.1.5", 30002, "decode-1 port", True)
    result = exposure.check_ports(local, ["10.0.0.2", "192.168.1.5"], [on_cluster, elsewhere], [])
    assert result.status is Status.FAIL and "decode-1 port 30002 reachable at 192.168.1.5" in result.details
    # Nothing up on the cluster address: nothing to expose, so no pass (issue 42).
    down = replace(on_cluster, reachable=False, error="Connection refused")
    assert exposure.check_ports(local, ["10.0.0.2"], [down], []).status is Status.SKIP


# --- which host a run stands on ---------------------------------------------------------------------------

def test_the_host_is_the_one_asked_for_else_this_machines_address_else_the_routers(dep, reference):
    assert choose_host(dep, "node-b", []).host == "node-b"
    found = choose_host(dep, None, ["192.168.1.5", "10.0.0.2"])
    assert found.host == "node-b" and "10.0.0.2 is this machine's" in found.why
    fallback = choose_host(dep, None, ["192.168.1.5"])
    assert fallback.host == "node-a" and "the router's host" in fallback.why
    with pytest.raises(HostChoiceError, match="its hosts are node-a, node-b"):
        choose_host(dep, "node-c", [])
    with pytest.raises(HostChoiceError, match="describes one host"):
        choose_host(reference, "node-a", [])
    assert choose_host(reference, None, []).host == ""


def test_the_command_reports_its_host_and_refuses_an_unknown_one(tmp_path: Path, reference_data, monkeypatch):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(two_hosts(reference_data)), encoding="utf-8")
    monkeypatch.setattr(context, "unavailable_reason", lambda: "no systemd in this test")
    run = CliRunner().invoke(main, ["verify", "-c", str(path), "--host", "node-b", "--only", "units", "--json",
                                    "--probe-timeout", "0.5"])
    data = json.loads(run.stdout)
    assert data["host"] == "node-b" and run.exit_code == 0, run.output
    checks = {c["id"]: c for c in data["checks"] if c["id"].startswith("units.")}
    assert checks["units.decode-1"]["observed"] == "skipped: no systemd in this test"
    assert f"run `pdserve verify -c {path} --host node-a` on node-a" in checks["units.router"]["observed"]
    listed = CliRunner().invoke(main, ["verify", "-c", str(path), "--list"])
    assert "units.decode-wide-node1" in listed.stdout.split() and listed.exit_code == 0
    unknown = CliRunner().invoke(main, ["verify", "-c", str(path), "--host", "node-c"])
    assert unknown.exit_code == 2 and "its hosts are node-a, node-b" in unknown.output
