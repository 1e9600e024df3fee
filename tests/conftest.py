"""Shared helpers: the reference deployment as data, and deployments built from edits of it."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdserve.render.reach import unreachable
from pdserve.render.toolchain import Toolchain
from pdserve.schema import pins
from pdserve.schema.config import Deployment
from pdserve.schema.loading import default_profile_text, deployment_from_data, parse_document

_REFERENCE = parse_document(default_profile_text(), "toml", "<default profile>")


@pytest.fixture
def reference_data() -> dict[str, Any]:
    """A fresh, mutable copy of the reference deployment as plain data."""
    return copy.deepcopy(_REFERENCE)


@pytest.fixture
def reference() -> Deployment:
    return deployment_from_data(copy.deepcopy(_REFERENCE), "<default profile>").deployment


@pytest.fixture
def tools() -> Toolchain:
    return Toolchain(
        sglang_python="/opt/sglang/bin/python",
        numactl="/usr/bin/numactl",
        pdserve="/opt/pdserve/bin/pdserve",
        keyed_launcher="/opt/pdserve/lib/keyed_launch.py",
    )


@pytest.fixture
def visible_tmp_path() -> Iterator[Path]:
    """A fresh directory the rendered units could see, for tools and files a test puts into a deployment:
    pytest's tmp_path is under /tmp, which their PrivateTmp=yes hides, so `check` and `render` refuse
    paths there (pdserve.render.reach). Under the home directory (ProtectHome=read-only leaves it
    readable); removed afterwards."""
    parent = Path.home() / ".cache" / "pdserve-tests"
    if unreachable(str(parent.resolve()), ("prefill", "router"), "execute"):
        pytest.skip(f"the home directory {Path.home()} is hidden from the units; tools there would be refused")
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def require_or_skip(condition: bool, reason: str, env_flag: str) -> None:
    """Skip with `reason` unless CI demands this tier, in which case a missing prerequisite fails."""
    if condition:
        return
    if os.environ.get(env_flag) == "1":
        pytest.fail(f"{reason}, but {env_flag}=1 demands this tier")
    pytest.skip(reason)


# The distributions an SGLang Python must hold, at the versions pdserve pins.
PINNED = {"sglang": pins.SGLANG_VERSION, pins.ROUTER_DISTRIBUTION: pins.ROUTER_VERSION,
          pins.NIXL_DISTRIBUTION: pins.NIXL_VERSION}


def require_the_pins_here() -> None:
    """Skip unless the Python running the tests holds the pins. CI installs them into this venv (.ci/setup):
    there a missing or other version fails, not skips."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = {name: version(name) for name in PINNED}
    except PackageNotFoundError as exc:
        found = {"missing": str(exc)}
    require_or_skip(found == PINNED, f"this environment does not have the pins the SGLang Python needs ({found})",
                    "PDSERVE_REQUIRE_PARSERS")
