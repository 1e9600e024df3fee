"""The multi-host tier's fixtures: each host of a deployment as a network namespace on one bridge, the
deployment rendered per host by `pdserve render --host`, each host's firewall applied and its processes
started, and the host-failure table printed in pytest's terminal summary (so CI's log has it without -s).

Why network namespaces running the rendered processes, and not one systemd-nspawn container per host:
what this tier tests is the network between hosts (cluster addresses, links, firewalls, a host going
away), and the units' own behaviour under a real systemd is the container tier's (tests/integration/
systemd). Each host here is its own network stack (interfaces, addresses, routes, netfilter tables)
joined to the others by a veth on a Linux bridge; its processes are started with the argv and
environment its units run. Five booted containers would add five systemds to two cores and test
nothing more about the network. (test_router_host_under_systemd.py boots one, for the router host's
units, whose readiness gates reach across hosts.)

Skipped, with the reason, when not root or iproute2 / nftables / the router / SGLang's parser are
missing; PDSERVE_REQUIRE_MULTIHOST=1 (CI) turns each of those skips into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.integration.multihost import plan as plans
from tests.integration.multihost.cluster import Cluster

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from multihost_net import cluster_network, remove_leftovers  # noqa: E402

# Its assertion helpers report what they compared, as a test's own asserts do.
pytest.register_assert_rewrite("tests.integration.multihost.checks")

REQUIRE = "PDSERVE_REQUIRE_MULTIHOST"

# Rows of the host-failure table (tests/integration/multihost/test_host_failure.py appends them).
HOST_FAILURE_ROWS: list[str] = []
HOST_FAILURE_HEADER: list[str] = []


def prerequisites() -> None:
    require_or_skip(sys.platform == "linux" and os.geteuid() == 0,
                    "the multi-host tier needs root (network namespaces, veths, a bridge)", REQUIRE)
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    require_or_skip(not missing, f"missing {', '.join(missing)} (apt-get install iproute2 nftables)", REQUIRE)
    absent = [m for m in ("smg", "sglang") if importlib.util.find_spec(m) is None]
    require_or_skip(not absent, f"the test environment lacks {', '.join(absent)} (smg 1.13.0, sglang 0.5.23)",
                    REQUIRE)


@contextmanager
def running(source: Path, tag: str, work: Path) -> Iterator[Cluster]:
    """The deployment at `source` rendered per host, on a bridge of its own (names tagged `tag`), every
    host's firewall applied, every process started and serving; all of it removed on exit."""
    prerequisites()
    left = remove_leftovers()
    if left:
        print(f"\nremoved leftovers of an earlier multi-host run: {', '.join(left)}")
    plan = plans.render(source, work / "rendered")
    with cluster_network(plan.addresses, plan.network, tag=tag) as net:
        net.check_links()
        cluster = Cluster(net, plan, work)
        try:
            # As on real hosts, each firewall is up before anything listens (NixOS applies it at boot).
            for host, ruleset in plan.firewalls.items():
                net[host].apply_nftables(ruleset)
            cluster.start_all()
            cluster.wait_serving()
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    """The tier's own deployment (tests/integration/multihost/deployment.toml), once for this directory's
    tests (removed after its last, not left running through the rest of the suite)."""
    with running(plans.OWN, "m", tmp_path_factory.mktemp("multihost")) as cluster:
        yield cluster


class _HostFailureTable:
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not HOST_FAILURE_ROWS:
            return
        terminalreporter.section("host failures (multi-host tier: network namespaces on a bridge, stand-in "
                                 "workers, real smg 1.13.0)")
        for line in [*HOST_FAILURE_HEADER, *HOST_FAILURE_ROWS]:
            terminalreporter.write_line(line)


def pytest_configure(config) -> None:
    config.pluginmanager.register(_HostFailureTable(), "pdserve-host-failure-table")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name in ("cluster", "example"):
            running_cluster = item.funcargs.get(name)
            if isinstance(running_cluster, Cluster):
                report.sections.append((f"multi-host logs ({name})", running_cluster.diagnostics()))
