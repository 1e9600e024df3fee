"""Requests through the real router (smg) on one host to stand-in prefill and decode servers on four
others (the tier's own deployment, tests/integration/multihost/deployment.toml), each host its own
network namespace with its own address on one bridge.

What crosses a link: the client (the root namespace, the operator's machine) -> the router host; the
router -> a prefill host and a decode host for every request; and the KV hand-off, decode -> the
prefill's bootstrap port at the address the router put into the request (bootstrap_host). The real
KV transfer (NIXL/Mooncake moving tensors, over RDMA when `--disaggregation-ib-device` is set) needs
GPUs: the stand-in's hand-off is a fetch of the request's bootstrap room from the prefill's bootstrap
server, over the same link and the same port, so a bootstrap port that cannot be reached from a
decode host fails the request as it would in SGLang.
"""

from __future__ import annotations

import pytest

from tests.integration.multihost.checks import (
    assert_every_server_served_and_every_hand_off_crossed_hosts,
    chat,
    listeners_off_their_address,
)

pytestmark = pytest.mark.integration

REQUESTS = 24


def test_every_listener_is_on_its_hosts_cluster_address(cluster):
    assert listeners_off_their_address(cluster) == []
    # From the router host (another namespace), every server's port accepts: the link carries it ...
    for process in cluster.plan.heads:
        outcome, _ = cluster.router_host.connect(cluster.plan.addresses[process.host], process.port)
        assert outcome == "connected", (process.name, outcome)
        # ... and nothing listens there on the router host's own loopback: the servers are elsewhere.
        assert cluster.router_host.connect("127.0.0.1", process.port)[0] == "refused", process.name


def test_chat_completions_cross_the_links_to_every_server_and_every_hand_off_crosses_one(cluster):
    # The router spread the requests (round_robin); every decode fetched its room from a prefill on another
    # host, over its link.
    assert_every_server_served_and_every_hand_off_crossed_hosts(cluster, chat(cluster, REQUESTS), REQUESTS)
