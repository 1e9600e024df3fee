"""The multi-host harness leaves nothing behind: a block that fails still removes its namespaces, veths,
bridge and every process started in them, and a run that was killed before its cleanup has its
leftovers removed by the next (they would otherwise hold the addresses and names the next run needs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.multihost.cluster import wait_for
from tests.integration.multihost.conftest import prerequisites

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from multihost_net import PREFIX, cluster_network, ip, remove_leftovers  # noqa: E402

pytestmark = pytest.mark.integration

# Outside the tier's own network, so this test can run beside a session that holds it.
NETWORK = "10.77.1.0/24"


def _ours() -> set[str]:
    namespaces = {line.split(" ", 1)[0] for line in ip("netns", "list").stdout.splitlines()}
    links = {line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show").stdout.splitlines()}
    return {n for n in namespaces | links if n.startswith(PREFIX)}


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def test_a_failing_block_removes_namespaces_links_and_processes(tmp_path):
    prerequisites()
    before = _ours()

    class Boom(Exception):
        pass

    procs = []
    with pytest.raises(Boom), cluster_network({"one": "10.77.1.1", "two": "10.77.1.2"}, NETWORK, tag="t1") as net:
        procs.append(net["one"].start(["sleep", "600"], tmp_path / "one.log"))
        # A grandchild outside the started process's group: only `ip netns pids` finds it.
        procs.append(net["two"].start(["sh", "-c", "setsid sleep 600 & wait"], tmp_path / "two.log"))
        net.check_links()
        wait_for(lambda: len(net["two"].pids()) >= 2, 10, "sh and its setsid sleep on host two")
        raise Boom
    assert _ours() == before
    for proc in procs:
        proc.wait(timeout=10)
    assert not any(_alive(p) for p in procs)
    setsid_sleeps = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True).stdout.split()
    assert setsid_sleeps == [], "a process in a removed namespace outlived it"


def test_leftovers_of_a_killed_run_are_removed_by_the_next():
    prerequisites()
    ip("netns", "add", f"{PREFIX}-t2-left")
    ip("link", "add", f"{PREFIX}t2v0", "type", "veth", "peer", "name", f"{PREFIX}t2v0p")
    removed = remove_leftovers()
    assert f"netns {PREFIX}-t2-left" in removed and f"link {PREFIX}t2v0" in removed, removed
    assert not any(n.startswith((f"{PREFIX}-t2", f"{PREFIX}t2")) for n in _ours())
