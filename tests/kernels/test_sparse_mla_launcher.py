"""CPU-only checks of the sparse MLA decode launcher's kernel choice against the H200 measurements it encodes
(what the fatbin's metadata says about those kernels: test_kernel_metadata.py)."""

import importlib

import pytest

mla_mod = importlib.import_module("pdserve_kernels.sparse_mla_decode")   # the package re-exports a function


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
    with pytest.raises(ValueError, match="fp8 variant must be one of"):   # the removed _o1 / _og / _od
        big.pick_kernel("v4", 16, variant="_o1", rows=128)
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


def test_wge_variant_and_fp32_scales_rule(monkeypatch):
    """"wge" (the exact-scale V3.2 wg kernel) on sm_90a; V4's UE8M0 scales are powers of two, so there "wge" is the
    default wg kernel; elsewhere the default choice. fp32_scales_kernel: wge where the default is a wg kernel."""
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    big, sm100 = _launcher(), _launcher(capability=(10, 0))
    assert big.pick_kernel("v32", 128, variant="wge", rows=64) == "sparse_mla_wg_v32_s3_e"
    assert big.pick_kernel("v4", 64, variant="wge", rows=64) == "sparse_mla_wg_v4_s3"
    assert sm100.pick_kernel("v32", 128, variant="wge", rows=64) == sm100.pick_kernel("v32", 128, rows=64)
    assert _launcher(smem_limit=101376).pick_kernel("v32", 128, variant="wge", rows=64) == "sparse_mla_v32_h16_t32"
    for h, rows in ((64, 8), (128, 64), (96, 128)):
        assert mla_mod.fp32_scales_kernel(h, rows, sm90=True) == "sparse_mla_wg_v32_s3_e"
        assert mla_mod.fp32_scales_kernel(h, rows, sm90=False) == mla_mod.ds_kernel_name("v32", h, rows)
    for h, rows in ((32, 64), (128, 1), (64, 7), (16, 128)):
        assert mla_mod.fp32_scales_kernel(h, rows, sm90=True) == mla_mod.ds_kernel_name("v32", h, rows)


# ---- the cluster-merge plan rule (opt-in; sm_90, 2..16 splits), against the metadata the build emits ----

@pytest.fixture(scope="module")
def mla_table(nvcc, tmp_path_factory):
    import os
    import pathlib
    import subprocess

    out = tmp_path_factory.mktemp("metadata")
    build = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "build.sh"
    subprocess.run(["bash", str(build), str(out)], check=True, capture_output=True, text=True, timeout=300,
                   env=dict(os.environ, NVCC=nvcc, METADATA_ONLY="1"))
    return mla_mod.load_kernel_table(out / "sparse_mla_decode.fatbin")


def _cm_launcher(table, capability=(9, 0)):
    obj = _launcher(capability=capability)
    obj.kernels = table
    return obj


@pytest.mark.parametrize("layout", ["v4", "v32", "v4_bf16", "v32_bf16"])
def test_cluster_merge_plans_the_16_head_twin_with_2_to_16_splits(mla_table, layout):
    gpu = _cm_launcher(mla_table)
    prefix = mla_mod._PREFIX[layout]
    ntot = 640 if layout.startswith("v4") else 2048   # V4 CSA (10 tiles), V3.2 top-2048 (32 tiles)
    for h, rows in ((16, 1), (8, 1), (32, 1), (16, 3)):
        auto = gpu.make_plan(layout, rows, h, ntot, cluster_merge=True)
        assert auto.kernel == f"sparse_mla_{prefix}_h16_t64_cm" and auto.cluster_merge, auto
        assert auto.splits == min(16, ntot // 64) and auto.workspace_floats == 0, auto   # capped at 16
    for splits in (2, 5, 10, 16):
        plan = gpu.make_plan(layout, 1, 16, 128 * splits - 37, splits=splits, cluster_merge=True)
        assert plan.splits == splits and plan.per_split == 128, plan
    # an explicit kernel: the first-version name takes its twin; the twin itself too
    base = f"sparse_mla_{prefix}_h16_t64"
    assert gpu.make_plan(layout, 1, 16, ntot, kernel=base, cluster_merge=True).kernel == base + "_cm"
    assert gpu.make_plan(layout, 1, 16, ntot, kernel=base + "_cm", cluster_merge=True).kernel == base + "_cm"
    # the default is unchanged: no cluster merge, the usual kernel and workspace
    plain = gpu.make_plan(layout, 1, 16, ntot, kernel=base)
    assert not plain.cluster_merge and not plain.kernel.endswith("_cm") and plain.workspace_floats > 0


def test_cluster_merge_refuses_what_it_cannot_run(mla_table):
    gpu = _cm_launcher(mla_table)
    for splits in (1, 17, 32):
        with pytest.raises(ValueError, match=r"2 <= splits <= 16, got"):
            gpu.make_plan("v4", 1, 16, 2048, splits=splits, cluster_merge=True)
    with pytest.raises(ValueError, match=r"2 <= splits <= 16; this shape plans 1"):   # one tile per row
        gpu.make_plan("v4", 1, 16, 64, cluster_merge=True)
    with pytest.raises(ValueError, match=r"this shape plans 1"):   # 132 rows fill the GPU: no split
        gpu.make_plan("v32_bf16", 132, 16, 2048, cluster_merge=True)
    for cap in ((12, 0), (10, 0), (8, 0)):
        with pytest.raises(ValueError, match="needs an sm_90 GPU"):
            _cm_launcher(mla_table, capability=cap).make_plan("v4", 1, 16, 640, cluster_merge=True)
    with pytest.raises(ValueError, match="not a v4 cluster-merge kernel"):   # no twin (ds, other head counts)
        gpu.make_plan("v4", 1, 16, 640, kernel="sparse_mla_ds_v4_h16_t64_s2", cluster_merge=True)
    with pytest.raises(ValueError, match="not a v4 cluster-merge kernel"):
        gpu.make_plan("v4", 1, 16, 640, kernel="sparse_mla_v4b_h16_t64_cm", cluster_merge=True)
    with pytest.raises(ValueError, match="pick one"):
        gpu.make_plan("v4", 1, 16, 640, fuse_combine=True, cluster_merge=True)
    with pytest.raises(ValueError, match="needs cluster_merge=True"):   # a _cm kernel launched without clusters
        gpu.make_plan("v4", 1, 16, 640, kernel="sparse_mla_v4_h16_t64_cm")
