"""`pdserve verify --host router`, run inside the router host's namespace, checks the servers on the other
hosts over the cluster network (through their firewalls, as the router reaches them), and skips the
checks only another host can make, naming the `--host` to run them with there. With one host's link cut,
exactly that host's server fails its checks, each naming the address that did not answer.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.multihost.cluster import Cluster
from tests.integration.multihost.plan import OWN

pytestmark = pytest.mark.integration

# Checks of one server that verify makes over the network (per server name).
REMOTE = ("kv", "server", "metrics", "versions")


def verify(cluster: Cluster, *args: str, host: str | None = None) -> tuple[int, dict[str, dict]]:
    """`pdserve verify --json` inside `host`'s namespace (default: the router's host)."""
    host = host or cluster.plan.router.host
    pdserve = cluster.plan.router.argv[0].rsplit("/", 1)[0] + "/pdserve"
    done = cluster.net[host].run([pdserve, "verify", "-c", str(OWN), "--host", host, "--json", *args],
                                 timeout=240, check=False)
    assert done.stdout.strip(), done.stderr
    return done.returncode, {check["id"]: check for check in json.loads(done.stdout)["checks"]}


def test_verify_on_the_router_host_checks_every_server_over_the_cluster_network(cluster):
    code, checks = verify(cluster)
    failed = {i: c["observed"] for i, c in checks.items() if c["status"] == "fail"}
    assert code == 0 and failed == {}, failed
    for server in cluster.plan.servers():
        for kind in REMOTE:
            assert checks[f"{kind}.{server.name}"]["status"] == "pass", checks[f"{kind}.{server.name}"]
    assert checks["e2e.chat"]["status"] == "pass" and checks["metrics.kv_transfer"]["status"] == "pass"
    # What only another host can read (its systemd, NVML, NUMA bindings, listening ports) is skipped, and
    # the skip says where to run it.
    for host in cluster.plan.addresses:
        if host == cluster.plan.router.host:
            continue
        local = [c for i, c in checks.items() if i.endswith(f".{host}") or f"on host {host}," in c["observed"]]
        assert local, f"no host-local check of {host}"
        for check in local:
            assert check["status"] == "skip" and f"--host {host}" in check["observed"], check


def test_verify_on_a_worker_host_checks_its_own_server_and_leaves_the_rest_to_the_router_host(cluster):
    """The rendered firewall opens a server's port only to its own host and the router's: run on a worker
    host, verify reads its own server over the cluster address and skips every check that would have to
    cross another host's firewall, naming the router's host, instead of failing a healthy cluster."""
    head = next(p for p in cluster.plan.heads if p.role == "prefill")
    code, checks = verify(cluster, "--probe-timeout", "2", host=head.host)
    failed = {i: c["observed"] for i, c in checks.items() if c["status"] == "fail"}
    assert code == 0 and failed == {}, failed
    for kind in REMOTE:
        assert checks[f"{kind}.{head.server}"]["status"] == "pass", checks[f"{kind}.{head.server}"]
    router_host = cluster.plan.router.host
    for server in cluster.plan.servers():
        if server.name == head.server:
            continue
        for kind in REMOTE:
            check = checks[f"{kind}.{server.name}"]
            assert check["status"] == "skip" and f"--host {router_host}" in check["observed"], check
    for check_id in ("router.readiness", "router.workers", "metrics.kv_transfer"):
        assert checks[check_id]["status"] == "skip" and f"--host {router_host}" in checks[check_id]["observed"]


def test_verify_fails_exactly_the_server_behind_a_cut_link(cluster):
    decode = next(p for p in cluster.plan.heads if p.role == "decode")
    cluster.cut(decode.host)
    try:
        code, checks = verify(cluster, "--probe-timeout", "2", "--chat-timeout", "15")
    finally:
        cluster.mend(decode.host)
    failed = {i for i, c in checks.items() if c["status"] == "fail"}
    assert code == 1
    assert {f"kv.{decode.server}", f"server.{decode.server}", f"metrics.{decode.server}"} <= failed, failed
    address = cluster.plan.addresses[decode.host]
    for check_id in (f"kv.{decode.server}", f"server.{decode.server}"):
        assert address in checks[check_id]["observed"], checks[check_id]
    # Every other server passes its checks: the failure is that host's, not the network's.
    for server in cluster.plan.servers():
        if server.name != decode.server:
            for kind in REMOTE:
                assert checks[f"{kind}.{server.name}"]["status"] == "pass", checks[f"{kind}.{server.name}"]
    # What may fail besides: the router's view (it lists that server) and the hand-off count (its metrics).
    assert failed - {f"{k}.{decode.server}" for k in REMOTE} <= {"router.readiness", "router.workers",
                                                                  "metrics.kv_transfer"}, failed
    cluster.wait_serving()
