"""Shared helpers: the reference deployment as data, and deployments built from edits of it."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from pdserve.render.toolchain import Toolchain
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


def require_or_skip(condition: bool, reason: str, env_flag: str) -> None:
    """Skip with `reason` unless CI demands this tier, in which case a missing prerequisite fails."""
    if condition:
        return
    if os.environ.get(env_flag) == "1":
        pytest.fail(f"{reason}, but {env_flag}=1 demands this tier")
    pytest.skip(reason)
