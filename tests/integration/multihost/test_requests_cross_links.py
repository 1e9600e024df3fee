"""Requests through the real sglang-router on one host to stand-in prefill and decode workers on four
others, each host its own network namespace with its own address on one bridge.

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
from openai import OpenAI

from tests.integration.multihost.plan import MODEL

pytestmark = pytest.mark.integration

REQUESTS = 24


def test_every_listener_is_on_its_hosts_cluster_address(cluster):
    """Workers and router listen on their host's own address: reached from another host, not via loopback."""
    for process in cluster.plan.processes:
        address = cluster.plan.addresses[process.host]
        assert process.url.startswith(f"http://{address}:"), (process.name, process.url)
        # From the router host (another namespace), the listener's port accepts: the link carries it.
        port = int(process.url.rsplit(":", 1)[1])
        outcome, _ = cluster.router_host.connect(address, port)
        assert outcome == "connected", (process.name, outcome)
    # And nothing listens on the router host's loopback for the workers' ports: they are elsewhere.
    for process in cluster.plan.role("prefill") + cluster.plan.role("decode"):
        outcome, _ = cluster.router_host.connect("127.0.0.1", int(process.url.rsplit(":", 1)[1]))
        assert outcome == "refused", (process.name, outcome)


def test_chat_completions_cross_the_links_to_every_worker_and_every_hand_off_crosses_one(cluster):
    before = {p.name: cluster.served(p) for p in cluster.plan.processes if p.role != "router"}
    handoffs_before = {p.name: cluster.served(p, "sglang:kv_transfer_latency_ms_count") for p in cluster.plan.role("prefill")}
    client = OpenAI(base_url=f"{cluster.plan.router.url}/v1", api_key="unused", timeout=30, max_retries=0)
    answers = []
    for index in range(REQUESTS):
        completion = client.chat.completions.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": f"Say hi ({index})."}])
        answers.append(completion.choices[0].message.content)
    assert all(answers), answers

    after = {p.name: cluster.served(p) for p in cluster.plan.processes if p.role != "router"}
    served = {name: after[name] - before[name] for name in after}
    # The router spread the requests: every prefill host and every decode host answered some (the
    # router's default policy picks at random: all of 24 on one of two hosts has odds 2^-23).
    assert all(n > 0 for n in served.values()), served
    for role in ("prefill", "decode"):
        assert sum(n for name, n in served.items() if name.startswith(f"{role}@")) == REQUESTS, served
    # Every decode fetched its room from a prefill on another host: the prefills' hand-off counts add up
    # to the requests. A decode host has no route to a prefill's listener except over its link.
    handoffs = {p.name: cluster.served(p, "sglang:kv_transfer_latency_ms_count") - handoffs_before[p.name]
                for p in cluster.plan.role("prefill")}
    assert sum(handoffs.values()) == REQUESTS, handoffs
    assert set(cluster.plan.hosts_of("prefill")).isdisjoint(cluster.plan.hosts_of("decode"))
