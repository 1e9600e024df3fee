"""CPU-only checks of the sparse MLA decode launcher's kernel choice against the H200 measurements it encodes
(what the fatbin's metadata says about those kernels: test_kernel_metadata.py). The fastest choice is the default for
V4 and, with the lossy opt-in, for V3.2; V3.2's exact default is exact_v32_kernel (test_exact_default.py)."""

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
# BENCHMARKS.md "wg kernels"); h = 96 / 128: the wgt cluster kernels, from 32 rows (2026-12-01, NOTES.md "wgt
# kernels"), at every row count since they convert ahead (2026-12-02, NOTES.md "One head block, and the cluster pair
# at every row count").
MEASURED_DEFAULT = {
    ("v4", 16, 1): "sparse_mla_v4_h16_t64", ("v4", 16, 8): "sparse_mla_v4_h16_t64",
    ("v4", 16, 64): "sparse_mla_ds_v4_h16_t32_s4", ("v4", 16, 128): "sparse_mla_ds_v4_h16_t32_s4",
    ("v4", 32, 8): "sparse_mla_v4_h32_t64", ("v4", 32, 64): "sparse_mla_wg_v4_s3",
    ("v4", 64, 1): "sparse_mla_v4_h64_t64", ("v4", 128, 1): "sparse_mla_wg_v4_t64x",
    ("v4", 64, 8): "sparse_mla_wg_v4_s3", ("v4", 64, 64): "sparse_mla_wg_v4_s3",
    ("v4", 64, 128): "sparse_mla_wg_v4_s3", ("v4", 128, 64): "sparse_mla_wg_v4_t64x",
    ("v4", 128, 8): "sparse_mla_wg_v4_t64x",
    ("v32", 16, 1): "sparse_mla_ds_v32_h16_t64_s2", ("v32", 16, 64): "sparse_mla_ds_v32_h16_t32_s4",
    ("v32", 32, 8): "sparse_mla_v32_h32_t64", ("v32", 32, 64): "sparse_mla_wg_v32_t64c",
    ("v32", 64, 1): "sparse_mla_ds_v32_h32_t64_s2", ("v32", 128, 1): "sparse_mla_wg_v32_t64x",
    ("v32", 64, 8): "sparse_mla_wg_v32_s3_c2", ("v32", 128, 8): "sparse_mla_wg_v32_t64x",
    # V3.2, one 64-head block, at most two splits per row: _t64c (2026-12-02 seventh session, call 4: 0.93-0.98x)
    ("v32", 64, 32): "sparse_mla_wg_v32_s3_c2", ("v32", 64, 64): "sparse_mla_wg_v32_t64c",
    ("v32", 64, 128): "sparse_mla_wg_v32_t64c",
    ("v32", 128, 64): "sparse_mla_wg_v32_t64x", ("v32", 128, 128): "sparse_mla_wg_v32_t64x",
    ("v32", 128, 32): "sparse_mla_wg_v32_t64x", ("v4", 96, 32): "sparse_mla_wg_v4_t64x",
    ("v4", 128, 16): "sparse_mla_wg_v4_t64x",
    # 17-63 heads: the 64-head wg kernels, 33-63 heads from 8 rows, 17-32 from 16 (2026-12-02 eighth session, calls
    # 6-7: 0.79-0.99x the ds or first-version kernel at 24 and 32 heads, 0.53-0.95x at 40-56), _t64c for V3.2 at most
    # two splits per row; below that as before (V3.2 17-32 heads: the first version below 16 rows, calls 14-15 of the
    # second session)
    ("v32", 24, 16): "sparse_mla_wg_v32_s3_c2", ("v32", 32, 24): "sparse_mla_wg_v32_s3_c2",
    ("v32", 32, 48): "sparse_mla_wg_v32_t64c", ("v32", 24, 8): "sparse_mla_v32_h32_t64",
    ("v4", 24, 16): "sparse_mla_wg_v4_s3", ("v4", 48, 16): "sparse_mla_wg_v4_s3",
    ("v4", 48, 128): "sparse_mla_wg_v4_s3", ("v32", 48, 16): "sparse_mla_wg_v32_s3_c2",
    ("v32", 48, 128): "sparse_mla_wg_v32_t64c", ("v4", 32, 15): "sparse_mla_v4_h32_t64",
    ("v4", 48, 8): "sparse_mla_wg_v4_s3", ("v4", 48, 4): "sparse_mla_v4_h64_t64",
    ("v32", 40, 8): "sparse_mla_wg_v32_s3_c2", ("v32", 56, 12): "sparse_mla_wg_v32_s3_c2",
    ("v4", 24, 12): "sparse_mla_v4_h32_t64",
    # V3.2, an odd number of 64-head blocks: the wg kernel from 4 rows (2026-12-02 call 21: 0.83x the ds kernel at
    # 128 heads, then the default there); an even number: the cluster pair at every row count
    ("v32", 192, 4): "sparse_mla_wg_v32_s3_c2", ("v32", 192, 2): "sparse_mla_ds_v32_h32_t64_s2",
    ("v32", 64, 4): "sparse_mla_ds_v32_h32_t64_s2", ("v32", 128, 4): "sparse_mla_wg_v32_t64x",
    ("v32", 128, 2): "sparse_mla_wg_v32_t64x", ("v32", 96, 4): "sparse_mla_wg_v32_t64x",
}


@pytest.mark.parametrize("key", sorted(MEASURED_DEFAULT))
def test_fastest_fp8_choice_is_the_measured_fastest(key, monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    layout, h, rows = key
    assert _launcher().pick_kernel(layout, h, rows=rows, lossy_bf16_dequant=True) == MEASURED_DEFAULT[key]
    # V4's scales are powers of two, so its fastest kernels are exact: they are its default without the opt-in;
    # V3.2's default is the exact choice
    default = _launcher().pick_kernel(layout, h, rows=rows)
    assert default == (MEASURED_DEFAULT[key] if layout == "v4" else mla_mod.exact_v32_kernel(h, rows, sm90=True))


# 16 heads, the rows' entry count known (make_plan passes topk + topk_extra): the 64-entry ds kernel in one split
# where it measured faster than the 32-entry one with its splits (2026-12-02 calls 10-11, h16_one_split_wins).
MEASURED_H16_BY_ENTRIES = {
    ("v4", 640, 64): "sparse_mla_ds_v4_h16_t32_s4", ("v4", 640, 80): "sparse_mla_ds_v4_h16_t32_s4",
    ("v4", 640, 96): "sparse_mla_ds_v4_h16_t64_s2", ("v4", 640, 128): "sparse_mla_ds_v4_h16_t64_s2",
    ("v4", 640, 132): "sparse_mla_ds_v4_h16_t64_s2", ("v4", 640, 160): "sparse_mla_ds_v4_h16_t32_s4",
    ("v4", 1152, 128): "sparse_mla_ds_v4_h16_t32_s4",                 # V4 HCA: the 32-entry kernel stays
    ("v32", 2048, 128): "sparse_mla_ds_v32_h16_t32_s4", ("v32", 2048, 160): "sparse_mla_ds_v32_h16_t64_s2",
    ("v32", 2048, 512): "sparse_mla_ds_v32_h16_t64_s2", ("v32", 1000, 512): "sparse_mla_ds_v32_h16_t32_s4",
}
# 16 heads below 64 rows (2026-12-02 calls 18-19, h16_t32_min_rows): the 32-entry ds kernel from 24 rows for V3.2
# and V4 HCA, from 40 for V4 CSA; below, V3.2 the 64-entry ds kernel, V4 the first version.
MEASURED_H16_FEW_ROWS = {
    ("v32", 2048, 16): "sparse_mla_ds_v32_h16_t64_s2", ("v32", 2048, 24): "sparse_mla_ds_v32_h16_t32_s4",
    ("v32", 2048, 48): "sparse_mla_ds_v32_h16_t32_s4", ("v4", 1152, 16): "sparse_mla_v4_h16_t64",
    ("v4", 1152, 24): "sparse_mla_ds_v4_h16_t32_s4", ("v4", 1152, 48): "sparse_mla_ds_v4_h16_t32_s4",
    ("v4", 640, 32): "sparse_mla_v4_h16_t64", ("v4", 640, 48): "sparse_mla_ds_v4_h16_t32_s4",
}


@pytest.mark.parametrize("key", sorted(MEASURED_H16_FEW_ROWS))
def test_16_heads_below_64_rows(key, monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    layout, entries, rows = key
    assert _launcher().pick_kernel(layout, 16, rows=rows, entries=entries) == MEASURED_H16_FEW_ROWS[key]


@pytest.mark.parametrize("key", sorted(MEASURED_H16_BY_ENTRIES))
def test_16_heads_take_one_long_split_where_measured_faster(key, monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    layout, entries, rows = key
    assert _launcher().pick_kernel(layout, 16, rows=rows, entries=entries) == MEASURED_H16_BY_ENTRIES[key]
    assert _launcher().pick_kernel(layout, 16, variant="ds", rows=rows, entries=entries) == MEASURED_H16_BY_ENTRIES[key]
    # without the entry count (a plan made before the step knows it): the 32-entry kernel from 64 rows, as before
    assert _launcher().pick_kernel(layout, 16, rows=rows) == f"sparse_mla_ds_{layout}_h16_t32_s4"
    # the bounds scale with the GPU's SMs (V4: one wave of the one-CTA-per-SM kernel, more than two thirds full)
    assert _launcher(num_sms=264).pick_kernel(layout, 16, rows=2 * rows, entries=entries) == \
        MEASURED_H16_BY_ENTRIES[key]


def test_split_convert_kernel_where_at_most_two_splits():
    # the boundary of wgtc_wins: rows x head blocks > num_sms / 3 (two splits or fewer), odd head-block counts only
    assert not mla_mod.wgtc_wins("v32", 64, 44, 132) and mla_mod.wgtc_wins("v32", 64, 45, 132)
    assert mla_mod.wgtc_wins("v32", 192, 15, 132) and not mla_mod.wgtc_wins("v32", 192, 14, 132)
    assert not mla_mod.wgtc_wins("v32", 128, 128, 132) and not mla_mod.wgtc_wins("v4", 64, 128, 132)
    assert mla_mod.wgtc_wins("v32", 64, 89, 264) and not mla_mod.wgtc_wins("v32", 64, 88, 264)


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


def test_wge_variant_and_exact_v32_rule(monkeypatch):
    """"wge" (the exact-scale V3.2 wg kernel) on sm_90a; V4's UE8M0 scales are powers of two, so there "wge" is the
    default wg kernel; elsewhere the default choice. exact_v32_kernel: wge where the fastest is a wg kernel."""
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    big, sm100 = _launcher(), _launcher(capability=(10, 0))
    assert big.pick_kernel("v32", 128, variant="wge", rows=64) == "sparse_mla_wg_v32_s3_e"
    assert big.pick_kernel("v4", 64, variant="wge", rows=64) == "sparse_mla_wg_v4_s3"
    assert sm100.pick_kernel("v32", 128, variant="wge", rows=64) == sm100.pick_kernel("v32", 128, rows=64)
    assert _launcher(smem_limit=101376).pick_kernel("v32", 128, variant="wge", rows=64) == "sparse_mla_v32_h16_t32"
    for h, rows in ((64, 8), (128, 64), (96, 128)):
        assert mla_mod.exact_v32_kernel(h, rows, sm90=True) == "sparse_mla_wg_v32_s3_e"
        assert mla_mod.exact_v32_kernel(h, rows, sm90=False) == mla_mod.ds_kernel_name("v32", h, rows)
    for h, rows in ((32, 64), (128, 1), (64, 7), (16, 128)):
        assert mla_mod.exact_v32_kernel(h, rows, sm90=True) == mla_mod.ds_kernel_name("v32", h, rows)
