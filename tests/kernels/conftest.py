import os
import pathlib
import shutil
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# The kernels' Python launcher lives in kernels/python (not part of the pdserve wheel).
sys.path.insert(0, str(REPO / "kernels" / "python"))


@pytest.fixture(scope="session")
def nvcc() -> str:
    """nvcc for the CPU build tests: PDSERVE_NVCC where it is set (CI: the nvcc .ci/setup pinned to the version
    the fatbins are built with), else nvcc on PATH or at /usr/local/cuda/bin/nvcc. Skipped without one, unless
    PDSERVE_REQUIRE_NVCC=1 demands them. (Not tests/conftest.require_or_skip: that module imports pdserve, which
    the GPU machines running tests/kernels with --confcutdir do not have.)"""
    pinned = os.environ.get("PDSERVE_NVCC")
    if pinned:
        found = pinned if os.access(pinned, os.X_OK) else None
    else:
        found = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
    if found is None:
        reason = (f"PDSERVE_NVCC={pinned} is not an executable: run .ci/setup" if pinned else
                  "nvcc not found on PATH or at /usr/local/cuda/bin/nvcc: cannot build the kernels")
        if os.environ.get("PDSERVE_REQUIRE_NVCC") == "1":
            pytest.fail(f"{reason}, but PDSERVE_REQUIRE_NVCC=1 demands these tests")
        pytest.skip(reason)
    return found


@pytest.fixture()
def gen():
    """A CUDA generator with a fresh seed per test, printed so a failing case can be replayed."""
    import torch  # only the GPU tests ask for it; the CPU build tests run without a GPU

    seed = time.time_ns() % (1 << 31)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    print(f"seed {seed}")
    return g
