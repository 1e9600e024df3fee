"""CPU-only checks of the sparse MLA decode launcher: kernel registry against the source, the default
kernel choice against the H200 measurements it encodes, and the ds kernels' shared-memory mirror."""

import importlib
import os
import pathlib
import re
import shutil
import subprocess

import pytest

mla_mod = importlib.import_module("pdserve_kernels.sparse_mla_decode")   # the package re-exports a function

REPO = pathlib.Path(__file__).resolve().parents[2]
SRC = REPO / "kernels" / "sparse_mla_decode" / "sparse_mla_decode.cu"


def test_kernel_registry_matches_the_source():
    src = SRC.read_text()
    ds = dict((m[0], tuple(int(x) for x in m[2:])) for m in
              re.findall(r"^DS_KERNEL\((\w+), Layout(V4|V32), (\d), (\d+), (\d), (\d)\)", src, re.M))
    assert set(ds) == set(mla_mod.DS_KERNELS), "DS_KERNELS must list exactly the DS_KERNEL(...) lines"
    for name, (mt, T, nst, cv) in ds.items():
        _, hb, T2, nst2, cv2 = mla_mod.DS_KERNELS[name]
        assert (16 * mt, T, nst, cv) == (hb, T2, nst2, cv2), name
    first = set(re.findall(r"^MLA_KERNEL\((\w+),", src, re.M))
    assert first == set(mla_mod.KERNELS), "KERNELS must list exactly the MLA_KERNEL(...) lines"
    wg = {m[0]: (m[1].lower(), int(m[2]), int(m[3])) for m in
          re.findall(r"^WG_KERNEL\((\w+), Layout(V4|V32), (\d), (\d), (?:true|false), (?:true|false)\)", src, re.M)}
    assert wg == mla_mod.WG_KERNELS, "WG_KERNELS must list exactly the WG_KERNEL(...) lines"


def _launcher(smem_limit=232448, num_sms=132, capability=(9, 0)):
    # pick_kernel needs only these fields; no GPU here.
    obj = object.__new__(mla_mod.SparseMlaDecode)
    obj.smem_limit, obj.num_sms, obj.capability = smem_limit, num_sms, capability
    return obj


# (layout, h, rows) -> kernel measured fastest on H200 (or within 1% of it; at rows <= 8, where calls are
# latency-bound and vary by ~1 us between runs, the first-version kernel unless the ds kernel won clearly),
# 2026-11-29, kernels/BENCHMARKS.md "ds kernels"; h >= 64 from 8 rows: the wg kernels (2026-11-30,
# BENCHMARKS.md "wg kernels").
MEASURED_DEFAULT = {
    ("v4", 16, 1): "sparse_mla_v4_h16_t64", ("v4", 16, 8): "sparse_mla_v4_h16_t64",
    ("v4", 16, 64): "sparse_mla_ds_v4_h16_t32_s4", ("v4", 16, 128): "sparse_mla_ds_v4_h16_t32_s4",
    ("v4", 32, 8): "sparse_mla_v4_h32_t64", ("v4", 32, 64): "sparse_mla_ds_v4_h32_t64_s2",
    ("v4", 64, 1): "sparse_mla_v4_h64_t64", ("v4", 128, 1): "sparse_mla_v4_h64_t64",
    ("v4", 64, 8): "sparse_mla_wg_v4_s3", ("v4", 64, 64): "sparse_mla_wg_v4_s3",
    ("v4", 64, 128): "sparse_mla_wg_v4_s3", ("v4", 128, 64): "sparse_mla_wg_v4_s3",
    ("v32", 16, 1): "sparse_mla_ds_v32_h16_t64_s2", ("v32", 16, 64): "sparse_mla_ds_v32_h16_t32_s4",
    ("v32", 32, 8): "sparse_mla_v32_h32_t64", ("v32", 32, 64): "sparse_mla_ds_v32_h32_t64_s2",
    ("v32", 64, 1): "sparse_mla_ds_v32_h32_t64_s2", ("v32", 128, 1): "sparse_mla_ds_v32_h32_t64_s2",
    ("v32", 64, 8): "sparse_mla_wg_v32_s3_c2", ("v32", 128, 128): "sparse_mla_wg_v32_s3_c2",
}


@pytest.mark.parametrize("key", sorted(MEASURED_DEFAULT))
def test_default_fp8_choice_is_the_measured_fastest(key, monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    layout, h, rows = key
    assert _launcher().pick_kernel(layout, h, rows=rows) == MEASURED_DEFAULT[key]


def test_explicit_variants_and_small_smem_gpus(monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    big, small = _launcher(), _launcher(smem_limit=101376)
    assert big.pick_kernel("v4", 16, variant="", rows=128) == "sparse_mla_v4_h16_t64"
    assert big.pick_kernel("v4", 16, variant="ds", rows=1) == "sparse_mla_ds_v4_h16_t64_s2"
    assert big.pick_kernel("v4", 16, variant="_o1", rows=128) == "sparse_mla_v4_h16_t64_o1"
    # sm_120-class GPUs (99 KB per block): the ds kernels do not fit, the 16-head 32-entry kernels run
    for variant in (None, "ds", "auto"):
        assert small.pick_kernel("v32", 64, variant=variant, rows=128) == "sparse_mla_v32_h16_t32"
    # bf16 KV has no fp8 variants
    assert big.pick_kernel("v4_bf16", 16, rows=128) == "sparse_mla_v4b_h16_t64"
    # the wg kernels (wgmma) exist for sm_90a only: elsewhere the default choice, forced or not
    sm100 = _launcher(capability=(10, 0))
    assert big.pick_kernel("v32", 128, variant="wg", rows=1) == "sparse_mla_wg_v32_s3_c2"
    assert big.pick_kernel("v4", 64, variant="wgh", rows=64) == "sparse_mla_wg_v4_s3_h"
    assert sm100.pick_kernel("v32", 128, variant="wg", rows=128) == sm100.pick_kernel("v32", 128, rows=128)
    assert sm100.pick_kernel("v32", 128, rows=128) == "sparse_mla_ds_v32_h32_t64_s2"


def test_ds_and_wg_shared_memory_fits_hopper():
    for name in mla_mod.DS_KERNELS:
        layout = mla_mod.DS_KERNELS[name][0]
        topk = 2048 if layout == "v32" else 640
        assert mla_mod.ds_smem_bytes(name, topk) <= 232448, name
    for name, (layout, _nst, _probe) in mla_mod.WG_KERNELS.items():
        topk = 2048 if layout == "v32" else 1152   # V3.2 top-2048; V4 HCA 1024 + 128 window entries
        assert mla_mod.wg_smem_bytes(name, topk) <= 232448, name


def test_ds_shared_memory_mirror_matches_the_kernel(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK)
                                    else None)
    if nvcc is None:
        pytest.skip("nvcc not found: cannot compile the host-side layout check")
    lines = []
    for name, (layout, hb, T, nst, _cv) in mla_mod.DS_KERNELS.items():
        lay = "LayoutV4" if layout == "v4" else "LayoutV32"
        lines.append(f'  printf("{name} %d\\n", DsSmem<{lay}, {hb // 16}, {T}, {nst}>::kSidx);')
    for name, (layout, nst, _probe) in mla_mod.WG_KERNELS.items():
        lay = "LayoutV4" if layout == "v4" else "LayoutV32"
        lines.append(f'  printf("{name} %d\\n", WgSmem<{lay}, {nst}>::kSidx + 1024);')
    prog = tmp_path / "layout.cu"
    prog.write_text(f'#include "{SRC}"\n#include <cstdio>\nint main() {{\n' + "\n".join(lines) + "\n}\n")
    exe = tmp_path / "layout"
    # Host-side only matters here; one real target keeps the compile short.
    subprocess.run([nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", str(prog), "-o", str(exe)],
                   check=True, capture_output=True, text=True, timeout=600)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        name, offset = line.split()
        assert mla_mod.smem_bytes(name, 0) == int(offset), f"{name}: launcher smem mirror is off"
