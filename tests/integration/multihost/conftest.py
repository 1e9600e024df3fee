"""The multi-host tier's fixtures: five "hosts" as network namespaces on one bridge (router, two prefill,
two decode hosts), the deployment's processes started on them once per session, and the host-failure
table printed in pytest's terminal summary (so CI's log has it without -s).

Why network namespaces and not one systemd-nspawn container per host: what this tier tests is the
network between hosts (cluster addresses, links, firewalls, a host going away), and the units' own
behaviour under a real systemd is the container tier's (tests/integration/systemd). Each host here is
its own network stack (interfaces, addresses, routes, netfilter tables) joined to the others by a veth
on a Linux bridge; its processes are started with pdserve's rendered argv and environment. Five booted
containers would add five systemds to two cores without testing anything more about the network.

Skipped, with the reason, when not root or iproute2 / the router / SGLang's parser are missing;
PDSERVE_REQUIRE_MULTIHOST=1 (CI) turns each of those skips into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.integration.multihost import plan as plans
from tests.integration.multihost.cluster import Cluster

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from multihost_net import cluster_network, remove_leftovers  # noqa: E402

REQUIRE = "PDSERVE_REQUIRE_MULTIHOST"
# Rows of the host-failure table (tests/integration/multihost/test_host_failure.py appends them).
HOST_FAILURE_ROWS: list[str] = []
HOST_FAILURE_HEADER: list[str] = []


def prerequisites() -> None:
    require_or_skip(sys.platform == "linux" and os.geteuid() == 0,
                    "the multi-host tier needs root (network namespaces, veths, a bridge)", REQUIRE)
    missing = [tool for tool in ("ip",) if shutil.which(tool) is None]
    require_or_skip(not missing, f"missing {', '.join(missing)} (apt-get install iproute2)", REQUIRE)
    absent = [m for m in ("sglang_router", "sglang") if importlib.util.find_spec(m) is None]
    require_or_skip(not absent, f"the test environment lacks {', '.join(absent)} (sglang-router 0.3.2, sglang 0.5.23)",
                    REQUIRE)


def require_nft() -> None:
    require_or_skip(shutil.which("nft") is not None, "nft is missing (apt-get install nftables)", REQUIRE)


@pytest.fixture(scope="session")
def plan() -> plans.Plan:
    return plans.from_single_host_renders()


@pytest.fixture(scope="session")
def net(plan):
    prerequisites()
    left = remove_leftovers()
    if left:
        print(f"\nremoved leftovers of an earlier multi-host run: {', '.join(left)}")
    with cluster_network(plan.addresses, plans.NETWORK) as net:
        net.check_links()
        yield net


@pytest.fixture(scope="session")
def cluster(net, plan, tmp_path_factory):
    running = Cluster(net, plan, tmp_path_factory.mktemp("multihost"))
    try:
        running.start_all()
        running.wait_serving()
        yield running
    finally:
        running.stop()


class _HostFailureTable:
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not HOST_FAILURE_ROWS:
            return
        terminalreporter.section("host failures (multi-host tier: network namespaces on a bridge, stand-in "
                                 "workers, real sglang-router 0.3.2)")
        for line in [*HOST_FAILURE_HEADER, *HOST_FAILURE_ROWS]:
            terminalreporter.write_line(line)


def pytest_configure(config) -> None:
    config.pluginmanager.register(_HostFailureTable(), "pdserve-host-failure-table")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "cluster" in item.fixturenames:
        running = item.funcargs.get("cluster")
        if running is not None:
            report.sections.append(("multi-host logs", running.diagnostics()))
