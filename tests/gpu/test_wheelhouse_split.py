"""The wheel set's travel, on the CPU: a wheel larger than one chunk (smg's is about 100 MB, a chunk at most
57 MiB) is cut into parts by wheelhouse.py, the parts arrive one chunk per call, and run_on_device.sh's
staging joins them into the same wheel, byte for byte, that pip then installs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu import wheelhouse

HERE = Path(__file__).resolve().parent
MIB = 2**20


def make_wheel(directory: Path, name: str, version: str, payload_bytes: int) -> Path:
    """A real, installable wheel whose module carries `payload_bytes` of incompressible data."""
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VERSION = '" + version.encode() + b"'\n",
        f"{name}/blob.bin": os.urandom(payload_bytes),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        record = []
        for member, data in files.items():
            archive.writestr(member, data)
            record.append(wheelhouse._record_line(member, data))
        archive.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return wheel


def build_chunks(out: Path, limit_mib: int) -> list[Path]:
    done = subprocess.run([sys.executable, str(HERE / "wheelhouse.py"), "--out", str(out), "--no-download",
                           "--chunk-mib", str(limit_mib)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(out.glob("c[0-9]*"))


def stage(chunk_root: Path, staged: Path, mode: str = "stage") -> subprocess.CompletedProcess:
    """run_on_device.sh as one device call with `chunk_root` carried as its .whl."""
    env = dict(os.environ, PDSERVE_WHEEL_CHUNKS=str(chunk_root), PDSERVE_WHEEL_STAGE=str(staged),
               OUT=str(staged.parent / "out"))
    return subprocess.run(["bash", str(HERE / "run_on_device.sh"), mode], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


@pytest.fixture
def wheels(tmp_path):
    pool = tmp_path / "whl" / "all"
    pool.mkdir(parents=True)
    big = make_wheel(pool, "bigwheel", "1.0", 3 * MIB + 12345)  # three-plus chunks of 1 MiB
    small = make_wheel(pool, "smallwheel", "2.0", 200 * 1024)
    return tmp_path / "whl", big.read_bytes(), small.read_bytes()


def test_a_wheel_larger_than_a_chunk_travels_in_parts_and_is_joined_byte_for_byte(tmp_path, wheels):
    out, big, small = wheels
    chunks = build_chunks(out, limit_mib=1)
    files = [f for c in chunks for f in c.iterdir()]
    assert all(sum(f.stat().st_size for f in c.iterdir()) <= MIB for c in chunks), "a chunk is over its limit"
    parts = sorted(f.name for f in files if ".part" in f.name)
    assert parts == [f"bigwheel-1.0-py3-none-any.whl.part{k}of4" for k in range(1, 5)]
    assert not [f for f in files if f.name == "bigwheel-1.0-py3-none-any.whl"], "the big wheel travelled whole"
    digest_chunk = next(c for c in chunks if (c / "bigwheel-1.0-py3-none-any.whl.sha256").exists())
    assert (digest_chunk / "bigwheel-1.0-py3-none-any.whl.part1of4").exists(), "the digest left its first part"

    staged = tmp_path / "staged"
    # One chunk per call, the last first: nothing is joined before every part is there.
    for i, chunk in enumerate(reversed(chunks)):
        carried = tmp_path / f"call{i}"
        shutil.copytree(chunk, carried / chunk.name)
        done = stage(carried, staged)
        assert done.returncode == 0, done.stdout + done.stderr
        if i < len(chunks) - 1:
            assert not (staged / "bigwheel-1.0-py3-none-any.whl").exists()
    assert "joined bigwheel-1.0-py3-none-any.whl from 4 parts" in done.stdout
    assert (staged / "bigwheel-1.0-py3-none-any.whl").read_bytes() == big
    assert (staged / "smallwheel-2.0-py3-none-any.whl").read_bytes() == small
    assert sorted(p.name for p in staged.iterdir()) == ["bigwheel-1.0-py3-none-any.whl",
                                                       "smallwheel-2.0-py3-none-any.whl"]
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                "--target", str(site), str(staged / "bigwheel-1.0-py3-none-any.whl")],
                               capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, installed.stderr
    assert (site / "bigwheel" / "blob.bin").stat().st_size == 3 * MIB + 12345


def test_a_corrupted_part_is_refused_and_a_missing_one_stops_the_run(tmp_path, wheels):
    out, _, _ = wheels
    chunks = build_chunks(out, limit_mib=1)
    carried = tmp_path / "carried"
    shutil.copytree(out, carried, ignore=shutil.ignore_patterns("all", "parts"))
    (second,) = carried.glob("c*/bigwheel-1.0-py3-none-any.whl.part2of4")
    data = second.read_bytes()
    # Flip the first byte's bits: overwriting it with a constant left the part intact one run in 256, since
    # the payload is random (CI, 2026-12-07).
    second.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    done = stage(carried, tmp_path / "staged")
    assert done.returncode == 1 and "do not match its digest" in done.stdout
    assert not (tmp_path / "staged" / "bigwheel-1.0-py3-none-any.whl").exists()

    # A run whose parts never all arrived stops before pip, naming what is missing.
    (third,) = [f for c in chunks for f in c.iterdir() if f.name.endswith(".part3of4")]
    only = tmp_path / "only"
    shutil.copytree(third.parent, only / third.parent.name)
    done = stage(only, tmp_path / "staged2", mode="run")
    assert done.returncode == 1 and "parts still missing" in done.stdout


# The V4 set's wheel sizes as wheelhouse.py --v4 left them in .whl/v4/all (2026-12-06: downloaded from PyPI,
# sglang_kernel and xgrammar trimmed), by distribution.
V4_MEASURED = {
    "tilelang": 50054335,
    "z3_solver": 29268352,
    "sglang": 22299652,
    "sglang_kernel": 18132173,
    "flashinfer_python": 14952951,
    "xgrammar": 13302524,
    "transformers": 11150587,
    "zstandard": 5546993,
    "jedi": 4885980,
    "sgl_deep_gemm": 4814939,
    "tokenizers": 3274982,
    "torchao": 3206172,
    "openai_harmony": 3049306,
    "anthropic": 2726387,
    "apache_tvm_ffi": 2697683,
    "torch_memory_saver": 2600103,
    "timm": 2485733,
    "pycryptodomex": 2280278,
    "pydantic_core": 2264846,
    "soundfile": 1313646,
    "openai": 1005551,
    "torch_c_dlpack_ext": 897846,
    "pyzmq": 855178,
    "wcwidth": 785946,
    "ipython": 649819,
    "pydantic": 494865,
    "watchfiles": 458353,
    "prompt_toolkit": 392288,
    "rpds_py": 371261,
    "jiter": 338071,
    "compressed_tensors": 260637,
    "msgspec": 236624,
    "cffi": 221822,
    "fastapi": 159475,
    "orjson": 130612,
    "dill": 120019,
    "gguf": 118475,
    "parso": 107025,
    "httpx2": 97893,
    "pybase64": 94689,
    "jsonschema": 90630,
    "uvicorn": 87427,
    "traitlets": 86211,
    "httpcore2": 85551,
    "starlette": 80571,
    "blobfile": 75413,
    "pexpect": 63772,
    "pycparser": 62600,
    "loguru": 61595,
    "opentelemetry_api": 60335,
    "setproctitle": 32929,
    "python_multipart": 32585,
    "executing": 29393,
    "asttokens": 28702,
    "referencing": 26766,
    "stack_data": 24521,
    "interegular": 23635,
    "docstring_parser": 22484,
    "distro": 20277,
    "truststore": 19017,
    "jsonschema_specifications": 18437,
    "typing_inspection": 14874,
    "ptyprocess": 13993,
    "annotated_types": 13427,
    "pure_eval": 11893,
    "partial_json_parser": 10877,
    "sniffio": 10235,
    "matplotlib_inline": 9534,
    "ipython_pygments_lexers": 8074,
    "cuda_python": 7594,
    "easydict": 6863,}


def test_the_measured_v4_set_packs_into_the_readmes_four_chunks(tmp_path):
    """tests/gpu/dsa/README.md's V4 chunk table is what chunk() makes of the measured sizes (sparse files of
    those sizes here): four chunks of at most 50 MiB, TileLang whole in the first, room left in a 64 MiB call for the
    working tree and, beside the last chunk, the plugin wheel; and the sizes are those of exactly the --v4 pins. (56
    MiB chunks stopped fitting on 2026-12-07, when the committed GPU records took the tree past 8 MiB.)"""
    pins = wheelhouse.v4_pins(wheelhouse.PINS.read_text(encoding="utf-8"))
    assert sorted(V4_MEASURED) == sorted(wheelhouse.pin_names(pins))
    files = []
    for name, size in V4_MEASURED.items():
        path = tmp_path / f"{name}-0-py3-none-any.whl"
        with path.open("wb") as f:
            f.truncate(size)
        files.append(path)
    limit = 50 * MIB
    items = [item for f in files for item in wheelhouse.split(f, limit, tmp_path / "parts")]
    assert items == files  # no wheel of the set needs parts
    bins = wheelhouse.chunk(items, limit)
    totals = [sum(f.stat().st_size for f in b) for b in bins]
    assert totals == [52_425_243, 52_423_182, 52_425_923, 51_969_938]
    assert [len(b) for b in bins] == [3, 3, 6, 59]
    assert bins[0][0].name.startswith("tilelang-")
    tree = sum(Path(p).stat().st_size for p in subprocess.run(
        ["git", "ls-files", "-z"], cwd=HERE.parents[1], capture_output=True, check=True).stdout.decode().split("\0")
        if p and (HERE.parents[1] / p).is_file())
    plugin = 1_019_896  # the pdserve-kernels wheel built 2026-12-07, carried with the last chunk
    assert max(totals) + tree <= 64 * MIB, f"a chunk ({max(totals)} B) and the working tree ({tree} B) exceed 64 MiB"
    assert totals[-1] + plugin + tree <= 64 * MIB, f"the last chunk, the plugin and the tree ({tree} B) exceed 64 MiB"
