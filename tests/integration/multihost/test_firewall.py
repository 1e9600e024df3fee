"""Each host's firewall, as `pdserve render --host NAME` writes it (pdserve-<name>-firewall.nft), applied
with `nft -f` inside that host's own network namespace before its processes start; the tier's cluster
runs behind them throughout (tests/integration/multihost/checks.py says what is expected of them).

A blocked connect is asserted by its cause (the rules drop: a timeout, not a refusal), and the rules
are shown to be that cause: with the host's ruleset flushed the same connect is accepted, and with the
file loaded again it is blocked again.
"""

from __future__ import annotations

import pytest

from tests.integration.multihost.checks import CLIENT, connect, wrong_firewall_paths

pytestmark = pytest.mark.integration


def test_every_host_runs_its_rendered_ruleset(cluster):
    for host in cluster.plan.addresses:
        assert f"table inet pdserve_{cluster.plan.dep.name}" in cluster.net[host].nft_ruleset(), host


def test_worker_ports_are_reachable_only_from_the_hosts_that_must_reach_them(cluster):
    assert wrong_firewall_paths(cluster) == []


@pytest.mark.parametrize("source", [CLIENT, "prefill-b"])
def test_the_rules_are_what_blocks_a_prefills_http_port(cluster, source):
    """Flush the prefill host's rules: its HTTP port, blocked for `source`, accepts; load the rendered
    file again: blocked again. (From the other prefill's host: a prefill's gate warms up through decodes
    only; the decode hosts reach it, for their gates' warm-up hand-off.)"""
    prefill = next(p for p in cluster.plan.heads if p.role == "prefill" and p.host != "prefill-b")
    host, address = cluster.net[prefill.host], cluster.plan.addresses[prefill.host]
    assert connect(cluster, source, address, prefill.port) == "timeout"
    host.run(["nft", "flush", "ruleset"])
    try:
        assert connect(cluster, source, address, prefill.port) == "connected"
    finally:
        host.apply_nftables(cluster.plan.firewalls[prefill.host])
    assert connect(cluster, source, address, prefill.port) == "timeout"
