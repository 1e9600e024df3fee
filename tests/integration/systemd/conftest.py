"""The container tier's fixtures: one booted systemd container per session, one deployment in it.

Skipped, with the reason, when not root or when debootstrap / systemd-nspawn / nsenter are missing;
PDSERVE_REQUIRE_CONTAINER=1 (CI) turns each of those skips into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.integration.systemd.container import booted, fresh_container

REPO = Path(__file__).resolve().parents[3]
REQUIRE = "PDSERVE_REQUIRE_CONTAINER"


def _prerequisites() -> None:
    require_or_skip(sys.platform == "linux" and os.geteuid() == 0,
                    "the systemd container tier needs root (debootstrap, systemd-nspawn, nsenter)", REQUIRE)
    missing = [tool for tool in ("debootstrap", "systemd-nspawn", "nsenter", "chroot") if shutil.which(tool) is None]
    require_or_skip(not missing, f"missing {', '.join(missing)} (apt-get install debootstrap systemd-container)",
                    REQUIRE)
    absent = [m for m in ("smg", "sglang") if importlib.util.find_spec(m) is None]
    require_or_skip(not absent, f"the test environment lacks {', '.join(absent)} (smg 1.13.0, sglang 0.5.23)",
                    REQUIRE)
    require_or_skip(sys.prefix != sys.base_prefix,
                    "run the tests from a virtual environment: it is bind-mounted into the container", REQUIRE)
    # The units run with PrivateTmp=yes: a checkout or venv under a temporary directory is invisible to them.
    hidden = [p for p in {str(REPO), sys.prefix, sys.base_prefix}
              if Path(p).resolve().is_relative_to("/tmp") or Path(p).resolve().is_relative_to("/var/tmp")
              or Path(p).resolve().is_relative_to("/dev/shm")]
    require_or_skip(not hidden, f"{', '.join(sorted(hidden))} is under a temporary directory, which services with "
                    "PrivateTmp= cannot see; run from a checkout and venv elsewhere (.ci/run copies itself)", REQUIRE)


@pytest.fixture(scope="session")
def container(tmp_path_factory):
    _prerequisites()
    with booted(fresh_container(tmp_path_factory.mktemp("systemd-container"), REPO)) as box:
        yield box


@pytest.fixture(scope="session")
def lab_session(container, tmp_path_factory):
    from tests.integration.systemd.lab import Lab

    return Lab.create(container, tmp_path_factory.mktemp("lab"))


@pytest.fixture
def lab(lab_session, request):
    """The session's deployment, with every unit stopped and disabled before and after the test."""
    lab_session.reset()
    yield lab_session
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed and lab_session.dep is not None:
        print("\n--- container diagnostics\n" + lab_session.diagnostics())
    lab_session.reset()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
