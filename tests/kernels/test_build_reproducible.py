"""CPU-only: two builds of the kernels' fatbins and metadata in different directories must be bit-identical."""

import hashlib
import os
import pathlib
import shutil
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]

KERNELS = ("dsa_indexer", "sparse_mla_decode")


def _build_copy(root: pathlib.Path, nvcc: str) -> dict[str, str]:
    # Copy the sources too, so the two builds differ in source path, work dir and output dir.
    src = root / "src"
    for k in (*KERNELS, "common"):   # common: what both modules include
        shutil.copytree(REPO / "kernels" / k, src / k)
    for f in ("build.sh", "kernel_metadata.cpp"):
        shutil.copy2(REPO / "kernels" / f, src / f)
    out = root / "out"
    env = dict(os.environ, NVCC=nvcc)
    subprocess.run(["bash", str(src / "build.sh"), str(out)], cwd=root, env=env, check=True,
                   capture_output=True, text=True, timeout=600)
    return {f"{k}{ext}": hashlib.sha256((out / f"{k}{ext}").read_bytes()).hexdigest()
            for k in KERNELS for ext in (".fatbin", ".json")}


def test_fatbin_is_bit_identical_across_build_dirs(nvcc, tmp_path):
    first = _build_copy(tmp_path / "a", nvcc)
    second = _build_copy(tmp_path / "b" / "deeper", nvcc)
    assert len(first) == 2 * len(KERNELS)
    for f in first:
        assert first[f] == second[f], f"kernels/build.sh: {f} differs between two build directories"
