"""The router host's own units under a real systemd: a systemd-nspawn container booted inside the router
host's network namespace (tests/integration/systemd/container.py), with what `pdserve render --host
router` writes for it installed in its /etc/systemd/system.

systemd orders units of one host only, so the router's unit waits for the servers on other hosts with
ExecStartPre= gates (`pdserve wait-ready <role> --server NAME`), which probe each server over the
cluster network. Checked here: with one prefill host's server down, the router's start holds in its
gates and its process does not start; once that host's server runs again, the gate passes, the router
process starts after it, and requests flow through the unit-run router to the servers on the other
hosts. The session's directly started router gives the host to the container meanwhile and takes it
back after.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.integration.multihost.checks import chat
from tests.integration.multihost.cluster import wait_for
from tests.integration.multihost.plan import OWN, REPO, tools
from tests.integration.systemd.conftest import _prerequisites as container_prerequisites
from tests.integration.systemd.container import booted, fresh_container

pytestmark = pytest.mark.integration

CONFIG_PATH = "/etc/systemd/system/pdserve-mh.json"
HELD = 8.0  # seconds the router's start is watched holding in its gates
REQUESTS = 8


def test_the_router_unit_waits_in_its_gates_for_a_server_on_another_host(cluster, tmp_path_factory, capsys):
    container_prerequisites()
    plan = cluster.plan
    router_host = cluster.net[plan.router.host]
    late = next(p for p in plan.heads if p.role == "prefill" and p.host != plan.router.host)
    unit = f"{plan.router.unit}.service"
    work = tmp_path_factory.mktemp("router-host-systemd")

    router_host.kill_all()  # the directly started router leaves the host to the container's units
    cluster.net[late.host].kill_all()
    try:
        with booted(fresh_container(work, REPO, network_namespace=router_host.ns)) as box:
            chain = tools()
            done = subprocess.run(
                [chain.pdserve, "render", "--host", plan.router.host, "-c", str(OWN), "--out",
                 str(box.path("/etc/systemd/system")), "--config-path", CONFIG_PATH, "--sglang-python",
                 chain.sglang_python, "--numactl", chain.numactl, "--pdserve", chain.pdserve],
                capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            box.run(["systemctl", "daemon-reload"])
            box.run(["systemctl", "start", "--no-block", unit])

            time.sleep(HELD)
            held = box.systemctl.show([unit])[unit]
            assert held.active_state == "activating" and held.sub_state == "start-pre", held.describe()
            assert held.main_pid == 0, "the router's process started before every server was ready"

            released_at = time.monotonic()
            cluster.start_host(late.host)
            wait_for(lambda: box.systemctl.show([unit])[unit].active_state == "active", 120,
                     f"{unit} to be active\n{box.journal(unit, 60)}", 0.5)
            started = box.systemctl.show([unit])[unit]
            # systemd's monotonic timestamps are this machine's CLOCK_MONOTONIC (the container has none of its own).
            assert started.exec_main_start_us / 1e6 > released_at, "the router started before the late server ran"
            journal = box.journal(unit, 300)
            assert f"sglang-{plan.dep.name}-{late.server} ready" in journal, journal

            served = chat(cluster, REQUESTS)
            assert sum(served[p.name] for p in plan.heads if p.role == "decode") == REQUESTS, served
            with capsys.disabled():
                print(f"\nrouter unit under systemd on host {plan.router.host}: held in start-pre {HELD:g} s with "
                      f"{late.name} down; its process started {started.exec_main_start_us / 1e6 - released_at:.1f} s "
                      f"after that server was started again; {REQUESTS} requests through it: {served}")
            box.run(["systemctl", "stop", unit], timeout=90)
    finally:
        # The session's cluster as it was: the late server and the directly started router running.
        if not cluster.net[late.host].pids():
            cluster.start_host(late.host)
        cluster.start_host(plan.router.host)
        cluster.wait_serving()
