"""The examples under hosts/ (two-host: prefill on one host, decode and router on the other; four-host:
two prefill hosts, one decode server spanning two hosts as one multi-node TP, the router on the decode's
first host) run as written: every host rendered by `pdserve render --host`, its firewall applied, its
processes started on a network namespace with the example's own cluster address. Nothing of the file is
changed for the test; the GPU-free parts are the stand-in behind `python -m sglang.launch_server` and
the router's API key, made up and handed over as systemd's LoadCredential= would.

The stand-in has no multi-node TP: a node of rank > 0 starts (its argv parsed by SGLang's own parser,
--nnodes/--node-rank/--dist-init-addr included) and answers on its own host, but nothing joins it to
node 0; what is checked of it is the firewall around it and that the router never uses it.
"""

from __future__ import annotations

import httpx
import pytest

from tests.integration.multihost.checks import (
    assert_every_server_served_and_every_hand_off_crossed_hosts,
    chat,
    listeners_off_their_address,
    wrong_firewall_paths,
)
from tests.integration.multihost.conftest import running
from tests.integration.multihost.plan import EXAMPLES

pytestmark = pytest.mark.integration

# Enough that four-host's power_of_two prefill policy (a random pair, ties either way) uses both prefills:
# all 24 on one of them has odds 2^-23.
REQUESTS = 24
TAGS = {"two-host": "x2", "four-host": "x4"}


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request, tmp_path_factory):
    with running(EXAMPLES[request.param], TAGS[request.param], tmp_path_factory.mktemp(request.param)) as cluster:
        yield cluster


def test_the_example_serves_across_its_hosts(example):
    assert listeners_off_their_address(example) == []
    assert_every_server_served_and_every_hand_off_crossed_hosts(example, chat(example, REQUESTS), REQUESTS)
    # The router was given node 0 of every server and nothing else.
    assert set(example.worker_health()) == {p.url for p in example.plan.heads}, example.worker_health()


def test_the_examples_firewalls_open_each_worker_port_only_to_the_hosts_that_use_it(example):
    assert wrong_firewall_paths(example) == []


def test_the_router_refuses_a_request_without_the_key(example):
    assert example.keyed, "the examples name router.api_key_file"
    body = {"model": example.plan.dep.model.served_name, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{example.plan.router.url}/v1/chat/completions", timeout=10, json=body)
    assert response.status_code == 401, response.text
