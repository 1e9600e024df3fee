import os
import pathlib
import shutil
import subprocess
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
    """A CUDA generator with a fresh seed per test, printed so a failing case can be replayed
    (PDSERVE_TEST_SEED=<seed> replays it)."""
    import torch  # only the GPU tests ask for it; the CPU build tests run without a GPU

    seed = int(os.environ.get("PDSERVE_TEST_SEED") or time.time_ns() % (1 << 31))
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    print(f"seed {seed}")
    return g


def _emit_metadata(nvcc: str, out: pathlib.Path, **env) -> pathlib.Path:
    """kernels/build.sh METADATA_ONLY=1 into `out`: each module's <module>.json from the headers (about a second,
    no fatbin)."""
    subprocess.run(["bash", str(REPO / "kernels" / "build.sh"), str(out)], check=True, capture_output=True,
                   text=True, timeout=300, env=dict(os.environ, NVCC=nvcc, METADATA_ONLY="1", **env))
    return out


@pytest.fixture(scope="session")
def metadata_dir(nvcc, tmp_path_factory) -> pathlib.Path:
    """The production build's metadata (dsa_indexer.json, sparse_mla_decode.json), for the CPU tests."""
    return _emit_metadata(nvcc, tmp_path_factory.mktemp("metadata"))


@pytest.fixture(scope="session")
def tuning_metadata_dir(nvcc, tmp_path_factory) -> pathlib.Path:
    """The tuning build's metadata (kernels/tuning/build.sh: <module>_tuning.json)."""
    return _emit_metadata(nvcc, tmp_path_factory.mktemp("tuning-metadata"), TUNING="1")


@pytest.fixture(scope="session")
def mla_table(metadata_dir):
    """The production sparse MLA kernel table, as a launcher on sparse_mla_decode.fatbin reads it."""
    from pdserve_kernels.sparse_mla_decode import load_kernel_table

    return load_kernel_table(metadata_dir / "sparse_mla_decode.fatbin")


@pytest.fixture(scope="session")
def mla_tuning_table(tuning_metadata_dir):
    """The tuning build's sparse MLA kernel table (the production kernels, the retired, experimental and probe ones)."""
    from pdserve_kernels.sparse_mla_decode import load_kernel_table

    return load_kernel_table(tuning_metadata_dir / "sparse_mla_decode_tuning.fatbin")
