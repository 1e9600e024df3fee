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


def _cases(section: str, key: tuple[str, ...]) -> dict[tuple, str]:
    """The measured cases of one section of the launcher's committed table (fp8_kernel_table.json): key -> kernel."""
    return {tuple(c[k] for k in key): c["kernel"] for c in mla_mod.FP8_TABLE[section]["cases"]}


# (layout, h, rows) -> kernel measured fastest on H200 (or within 1% of it); the date and call of each are in the table.
MEASURED_DEFAULT = _cases("measured_fastest", ("layout", "heads", "rows"))


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
# where it measured faster than the 32-entry one with its splits (h16_one_split_wins).
MEASURED_H16_BY_ENTRIES = _cases("measured_16_heads_by_entries", ("layout", "entries", "rows"))
# 16 heads below 64 rows (h16_t32_min_rows): the 32-entry ds kernel from 24 rows for V3.2 and V4 HCA, from 40 for V4
# CSA; below, V3.2 the 64-entry ds kernel, V4 the first version.
MEASURED_H16_FEW_ROWS = _cases("measured_16_heads_few_rows", ("layout", "entries", "rows"))


def test_the_table_is_whole():
    # every case names a kernel, each key once (a repeated key would hide a second, different measurement)
    for section in ("measured_fastest", "measured_16_heads_by_entries", "measured_16_heads_few_rows"):
        cases = mla_mod.FP8_TABLE[section]["cases"]
        keys = [tuple(sorted((k, v) for k, v in c.items() if k != "kernel")) for c in cases]
        assert len(keys) == len(set(keys)), section
        assert all(c["kernel"].startswith("sparse_mla_") for c in cases), section
    assert len(MEASURED_DEFAULT) == 50 and len(MEASURED_H16_BY_ENTRIES) == 11 and len(MEASURED_H16_FEW_ROWS) == 8
    for name, entry in mla_mod.FP8_TABLE["thresholds"].items():
        assert isinstance(entry["value"], int) and entry["measured"], name


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
    # bf16 KV has no fp8 variants (V4's bf16 kernels, tuning build only: test_exact_default.py)
    for variant in (None, "ds", "wg"):
        assert big.pick_kernel("v32_bf16", 16, variant=variant, rows=128) == "sparse_mla_v32b_h16_t64"
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
