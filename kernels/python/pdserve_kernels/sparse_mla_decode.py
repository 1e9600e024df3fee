"""Launcher for the sparse MLA decode kernel (kernels/sparse_mla_decode/sparse_mla_decode.cu).

Conventions (FlashMLA's sparse decode, so callers can swap them):

* ``q``: bf16 ``[B, next_n, h, d_qk]`` (or ``[B, h, d_qk]`` for next_n = 1); d_qk = 512 ("v4") or 576 ("v32").
  Each of the B * next_n query rows has its own indices. Any h >= 1 (16-head blocks; h = 8 uses half of
  one 16-row MMA tile).
* ``kv``: uint8 / float8_e4m3fn ``[num_blocks, page, 1, bytes_per_entry]`` (or ``[num_blocks, page, bytes]``)
  in FlashMLA's layout (see ``sparse_mla_reference``); dims after the first contiguous, any block stride
  (FlashMLA pads blocks). page must be a power of two. bf16 KV: a bfloat16 ``[num_blocks, page, 1, d_qk]``
  (or ``[num_blocks, page, d_qk]``) tensor selects the bf16 kernels (layout "v4" or "v32" as for fp8, or
  "v4_bf16" / "v32_bf16" explicitly); V4: K = V = the 512-dim entry, V3.2: V = its first 512 dims. V4's bf16
  kernels are in the tuning fatbin only (``TUNING_ONLY_LAYOUTS``; SGLang's V4 cache is FP8): a launcher on the
  production fatbin refuses "v4_bf16" and says how to load the tuning one (``layout_refusal``).
* ``indices``: int32 ``[B, next_n, topk]`` (or ``[B, topk]``): ``physical_block * page + offset``; -1 (or any
  index outside the cache) is skipped.
* optional ``extra_kv`` + ``extra_indices`` ``[B, next_n, topk_extra]``: a second source in the same layout,
  attended together with the first in the same launch, with its own page size and block stride (SGLang's V4 decode
  passes its window cache at page 256 as ``kv`` and the C4 or C128 cache at page 64 or 2 as ``extra_kv``).
* ``sm_scale``: softmax scale; ``sinks``: fp32 ``[h]`` or None.

Returns ``(out bf16 [B, next_n, h, 512], lse fp32 [B, next_n, h])``; lse is the natural-log sum over the
valid entries, without the sink; a row with no valid entry gets out = 0, lse = +inf.

Exact by default: every call without ``lossy_bf16_dequant=True`` runs a kernel that applies the cache's scales
without rounding the dequantized values to bf16 (``applies_scales_exactly``), so it is exact on any fp32 scale,
SGLang's amax/448 V3.2 tile scales included (error at the bf16 output's floor). V4's UE8M0 scales are powers of two
and bf16 KV has none, so there every kernel is exact; V3.2 FP8 takes the ds or wge kernels (``exact_v32_kernel``),
and where none fits (GPUs with < 200 KB of shared memory per block, e.g. sm_120) make_plan refuses the call.
``lossy_bf16_dequant=True`` is the faster lossy path, an explicit opt-in: V3.2 FP8 may then take the kernels that
convert e4m3 x scale into one bf16 tile (first-version, wg, wgt and cluster kernels): exact only for power-of-two
scales (NOTES.md "Exact by default" has their measured error on amax/448 scales).

Kernel choice (fp8), one table for every caller (``default_fp8_kernel``; the SGLang plugin plans through it too):
the fastest kernel measured on H200 for the layout, head count and number of query rows among those the call allows.
``auto_fp8_kernel``, the fastest of all: on sm_90a with an even number of 64-head blocks (96-128 heads) the wgt
cluster kernels at every row count (``wgx_kernel_name``: 64-entry tiles gathered through registers, the two 64-head
CTAs of a row sharing every converted tile), else with h >= 64 and >= 8 rows the "wg" kernels (wgmma, 64 heads per
CTA, a producer warpgroup converting each tile once; V3.2 with at most two splits per row their 64-entry successor
``WGTC_V32``, warpgroup 1 converting half of each tile), else the "ds" kernels (warps split the head dimension, e4m3
converted inside the MMA operands) or the first-version kernels. V3.2 FP8 without the lossy opt-in: the "wge"
kernel on sm_90a at h >= 64 from 8 rows, else the ds kernels (``exact_v32_kernel``). ``variant=`` ("wgx", "wg",
"wge", "ds", "" ...) / ``kernel=`` force one (a V3.2 kernel that rounds still needs the lossy opt-in). The ds kernels
multiply V by its scale in f16: |dequantized V| must stay below 65504, and values below f16's normal range (6.1e-5)
keep fewer bits (the wge kernel has neither limit). ``fuse_combine`` merges a plan's splits in the
main kernel instead of a second (combine) launch, where the kernel can (``fused_counters_per_block``): the wg
kernels' split pairs, by default (``None``), and the ds kernels' last-CTA combine, correct but measured slower, with
``True`` (NOTES.md); and the cluster pair's two splits (``_t64x_m``).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import pathlib
from dataclasses import dataclass

from ._driver import Module, locate_fatbin
from ._launcher import DeviceKernels, PerDevice
from ._metadata import KernelInfo, KernelTable, load_table, metadata_path
from .sparse_mla_reference import LAYOUTS

DV = 512


class _Params(ctypes.Structure):
    # Mirrors struct MlaParams in sparse_mla_decode.h.
    _fields_ = [
        ("q", ctypes.c_void_p), ("kv", ctypes.c_void_p), ("kv_extra", ctypes.c_void_p),
        ("indices", ctypes.c_void_p), ("indices_extra", ctypes.c_void_p), ("sinks", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("o_part", ctypes.c_void_p),
        ("lse_part", ctypes.c_void_p),
        ("block_stride", ctypes.c_longlong), ("block_stride_extra", ctypes.c_longlong),
        ("num_entries", ctypes.c_int), ("num_entries_extra", ctypes.c_int), ("page_shift", ctypes.c_int),
        ("rows", ctypes.c_int), ("h", ctypes.c_int), ("topk", ctypes.c_int), ("topk_extra", ctypes.c_int),
        ("splits", ctypes.c_int), ("per_split", ctypes.c_int), ("scale_log2", ctypes.c_float),
        ("page_shift_extra", ctypes.c_int), ("counters", ctypes.c_void_p),
    ]


# Kernel names are built from these prefixes and checked against the fatbin's metadata (<fatbin>.json, written
# by kernels/build.sh from sparse_mla_decode.h: every kernel's threads, shared memory and shape come from there).
_PREFIX = {"v4": "v4", "v32": "v32", "v4_bf16": "v4b", "v32_bf16": "v32b"}
# Layouts whose kernels only the tuning build holds (kernels/tuning/sparse_mla_decode_tuning.h), each with the reason:
# the production fatbin holds only kernels some plugin call can reach (issue 38 item 3).
TUNING_ONLY_LAYOUTS = {
    "v4_bf16": ("the production build is FP8-only for V4 because SGLang's V4 KV cache is FP8 (584 B per entry), so no "
                "plugin call could reach a bf16 V4 kernel"),
}


def layout_refusal(layout: str, table: KernelTable) -> str | None:
    """Why a launcher over `table` cannot serve `layout`, with the fix; None where it can. Only a tuning-only layout
    is refused, and only by a table without its kernels (a production build's)."""
    why = TUNING_ONLY_LAYOUTS.get(layout)
    if why is None or any(k.shape.get("layout") == layout for k in table.kernels.values()):
        return None
    fatbin = table.path.with_suffix(".fatbin").name   # the table is read from the fatbin's .json
    return (f"layout {layout!r} has no kernel in {fatbin}: {why}. To run it, build the tuning fatbin "
            "(`bash kernels/tuning/build.sh [OUTDIR]`, OUTDIR default kernels/build) and load "
            "OUTDIR/sparse_mla_decode_tuning.fatbin: SparseMlaDecode(fatbin=...) or "
            "PDSERVE_SPARSE_MLA_FATBIN=OUTDIR/sparse_mla_decode_tuning.fatbin")


# The fp8 kernel choice: "auto" (default) = auto_fp8_kernel below, the fastest kernel measured on H200 per
# (layout, heads, rows) (NOTES.md, "ds kernels"); "" = the first-version kernels, "ds" = the ds kernels for
# every shape, "wg" / "wgh" = the wg kernels, "wge" = the exact-scale wg kernels, "wgx" = the wgt cluster kernels
# (all sm_90a).
# PDSERVE_SPARSE_MLA_FP8_OPT overrides.
FP8_VARIANT = os.environ.get("PDSERVE_SPARSE_MLA_FP8_OPT", "auto")
# The kernel choice's thresholds, each with the measurement behind it, and the measured cases the choice must
# reproduce: one committed table (fp8_kernel_table.json, beside this module) that tests/kernels reads too.
FP8_TABLE = json.loads((pathlib.Path(__file__).with_name("fp8_kernel_table.json")).read_text())


def _threshold(name: str) -> int:
    return int(FP8_TABLE["thresholds"][name]["value"])


# Rows (B * next_n) from which the ds kernels are picked where they won only at large batch.
DS_MIN_ROWS = _threshold("ds_min_rows")
# V3.2 with 17-32 heads: the ds kernels from this many rows, the first version below.
V32_H32_DS_MIN_ROWS = _threshold("v32_h32_ds_min_rows")


def ds_kernel_name(layout: str, h: int, rows: int | None, entries: int | None = None, num_sms: int = 132) -> str:
    """The ds kernel for fp8 `layout` ("v4" / "v32"), h heads, `rows` query rows (None: few) and `entries`
    indices per row (topk + topk_extra; None: unknown)."""
    if h <= 16:   # 32-entry tiles fit two CTAs per SM: better once the GPU is full, worse for short rows
        many = rows is not None and rows >= h16_t32_min_rows(layout, entries)
        if many and entries is not None and h16_one_split_wins(layout, rows, entries, num_sms):
            return f"sparse_mla_ds_{layout}_h16_t64_s2"
        return f"sparse_mla_ds_{layout}_h16_t32_s4" if many else f"sparse_mla_ds_{layout}_h16_t64_s2"
    return f"sparse_mla_ds_{layout}_h32_t64_s2"


H16_T32_MIN_ROWS_V32 = _threshold("h16_t32_min_rows_v32")
H16_T32_MIN_ROWS_V4_SHORT = _threshold("h16_t32_min_rows_v4_short")   # at most 640 entries per row (V4 CSA)
H16_T32_MIN_ROWS_V4_LONG = _threshold("h16_t32_min_rows_v4_long")


def h16_t32_min_rows(layout: str, entries: int | None) -> int:
    """Rows from which 16 heads take the 32-entry ds kernel (two CTAs per SM), below them V3.2 the 64-entry ds kernel
    and V4 the first-version kernel (fp8_kernel_table.json, h16_t32_min_rows_*). Without the entry count V4 keeps
    DS_MIN_ROWS."""
    if layout == "v32":
        return H16_T32_MIN_ROWS_V32
    if entries is None:
        return DS_MIN_ROWS
    return H16_T32_MIN_ROWS_V4_SHORT if entries <= 640 else H16_T32_MIN_ROWS_V4_LONG


def h16_one_split_wins(layout: str, rows: int, entries: int, num_sms: int) -> bool:
    """Where the 64-entry 16-head ds kernel (one CTA per SM, so one split from num_sms / 2 rows on) beats the
    32-entry one (two CTAs per SM, its splits merged by the combine). Measured on H200 (bench_mla_variants.py,
    2026-12-02 second session, calls 10-11; NOTES.md "16 heads from ~100 rows"), us, t32_s4 / t64_s2: V4 CSA (640
    entries) 80 rows 38.5 / 41.3 (3 splits against 1), 96-132 rows 45.2-48.2 / 40.5-41.6 (2 against 1: no combine),
    160 rows 57.1 / 76.7 (two waves of the one-per-SM kernel); V4 HCA (1152) 0.99-1.07x the other way at 96-128;
    V3.2 (2048) 128 rows 90.7 / 101.5, 160-512 rows 221.0-420.4 / 191.3-373.8 (both one split)."""
    if layout == "v4":   # measured at 640 (V4-Flash CSA: 512 + 128); shorter rows: fewer tiles per split, same trade
        return entries <= 640 and 2 * num_sms < 3 * rows <= 3 * num_sms
    return entries >= 2048 and rows > num_sms


def auto_fp8_kernel(layout: str, h: int, rows: int | None, num_sms: int, sm90: bool = False,
                    entries: int | None = None) -> str | None:
    """The fastest fp8 kernel measured: a wg or ds kernel name, or None for the first-version kernel of that shape.
    Exact for V4; for V3.2 the kernel default_fp8_kernel takes only with the lossy opt-in (its wg, cluster and
    first-version kernels round e4m3 x fp32 scale to bf16).

    On sm_90a with an even number of 64-head blocks, the wgt cluster kernels at every row count (wgx_serves). Else
    on sm_90a with h > 32 and >= 8 rows, or 17-32 heads and >= WG_MID_HEADS_MIN_ROWS rows: V3.2 at most two splits
    per row WGTC_V32 (wgtc_wins), else the wg kernels (h >= 64: 2026-11-30 H200 table, bench_wg.py, now part of
    bench_mla_variants.py: 1.03-1.75x faster there, 0.82-0.98x at one row; 17-63 heads: WG_MID_HEADS_MIN_ROWS).
    Otherwise from the 2026-11-29 H200 table (bench_mla_variants.py; V4 CSA 640 entries, V3.2 2048; B = 1/8/64/128):
    V3.2 takes the ds kernels everywhere except 17-32 heads below V32_H32_DS_MIN_ROWS rows; V4 only with >= 64 rows
    (16 heads: from h16_t32_min_rows), and for h > 32 only while its 32-head blocks fit in one wave (they gather every
    entry once per head block). Which 16-head ds kernel depends on `entries` too (ds_kernel_name, h16_one_split_wins).
    """
    if sm90 and wgx_serves(h):   # at every row count (NOTES.md "One head block, and the cluster pair ...")
        return wgx_kernel_name(layout)
    wg_min_rows = (WG_V32_MULTI_BLOCK_MIN_ROWS if layout == "v32" and h > 64 else WG_MIN_ROWS if h > 32
                   else WG_MID_HEADS_MIN_ROWS)
    if sm90 and h > 16 and rows is not None and rows >= wg_min_rows:
        return WGTC_V32 if wgtc_wins(layout, h, rows, num_sms) else wg_kernel_name(layout)
    many = rows is not None and rows >= DS_MIN_ROWS
    if layout == "v32":
        mid_rows = rows is not None and rows >= V32_H32_DS_MIN_ROWS
        return ds_kernel_name(layout, h, rows, entries, num_sms) if (h <= 16 or h > 32 or mid_rows) else None
    if h <= 16 and rows is not None and rows >= h16_t32_min_rows(layout, entries):
        return ds_kernel_name(layout, h, rows, entries, num_sms)
    if not many:
        return None
    if h <= 32 or rows * -(-h // 32) <= num_sms:
        return ds_kernel_name(layout, h, rows, entries, num_sms)
    return None


# "wg" kernels (fp8, sm_90a only; 384 threads: a producer warpgroup converting each 32-entry tile once into
# bf16, two consumer warpgroups on wgmma, 64 heads per CTA; kernels/sparse_mla_decode/wg.cuh).
# "_h": the tile, Q and P in f16 (cheaper conversion; measured 9% faster than bf16 at V3.2 h=128 B=64, slower at
# B <= 8). Opt-in (variant "wgh"), not the default: |e4m3 x scale| and |RoPE| must stay below 65504 (exact for
# power-of-two scales 2^-15 .. 2^7). "_c2": warpgroup 1 converts half of every tile (it idles while warpgroup 0
# runs QK and the softmax).
# Where the default takes them: from 8 rows at h >= 64 (measured faster at h = 64 and 128) and, by the rule below, at
# 17-63 heads; WG_MIN_HEADS also bounds where the exact V3.2 choice takes the wge kernel (exact_v32_kernel).
WG_MIN_HEADS, WG_MIN_ROWS = _threshold("wg_min_heads"), _threshold("wg_min_rows")
# 17-63 heads (one 64-head block, the heads past h zero-filled): the same wg kernels from this many rows (33-63 heads
# from WG_MIN_ROWS, as 64 do; below 8 rows not measured: the former choice).
WG_MID_HEADS_MIN_ROWS = _threshold("wg_mid_heads_min_rows")
# V3.2 with more than one 64-head block: the wg kernel from this many rows (V4 kept its choice there).
WG_V32_MULTI_BLOCK_MIN_ROWS = _threshold("wg_v32_multi_block_min_rows")


def wg_kernel_name(layout: str) -> str:
    """The default wg kernel (2026-11-30 H200, bench_wg.py, now in bench_mla_variants.py): V3.2 "_c2" (warpgroup
    1 converts half of each tile: 5-8% faster than the plain kernel at B >= 64, equal at B = 8); V4 the plain one
    (_c2 was 0-8% slower there: a V4 entry is cheaper to convert, so the extra hand-off costs more than it
    saves)."""
    return f"sparse_mla_wg_{layout}_s3_c2" if layout == "v32" else f"sparse_mla_wg_{layout}_s3"


# The wgt kernel with warpgroup 1 converting half of every tile (fp8 V3.2, sm_90a; 64-entry tiles, one CTA per 64-head
# block; NOTES.md "wgt kernels", "One head block, and the cluster pair at every row count"): where the wg default's
# plan has at most two splits.
WGTC_V32 = "sparse_mla_wg_v32_t64c"


def wgtc_wins(layout: str, h: int, rows: int, num_sms: int) -> bool:
    """Whether the V3.2 default at an odd number of 64-head blocks is WGTC_V32 rather than the wg kernel: at most two
    splits per row (rows x head blocks > num_sms / 3). Measured on H200 (bench_mla_variants.py, 2026-12-02 seventh
    session, call 4), h = 64, us, wg_v32_s3_c2 (its _m at two splits) / _t64c (_t64c_m): 128 rows 141.3 / 134.4, 96
    rows 139.3 / 130.0, 64 rows (two splits, merged) 84.3 / 82.3; with more splits slower: 32 rows (4) 53.5 / 58.9,
    16 rows 36.0 / 41.6, 8 rows 26.8 / 31.2. V4 keeps the wg kernel (1.00-1.02x at 64-128 rows, call 3)."""
    return layout == "v32" and -(-h // 64) % 2 == 1 and 3 * rows * -(-h // 64) > num_sms


# "wgt" cluster kernels (fp8, sm_90a; kernels/sparse_mla_decode/wgt.cuh; NOTES.md "wgt kernels"): the
# wg kernels' three warpgroups with 64-entry tiles gathered through the producer's registers (no raw ring), the two
# 64-head CTAs of a row as one thread-block cluster, each gathering and converting half of every tile and copying it
# in bulk into the other, so every entry is loaded once per row, not once per head block. They serve an even number
# of 64-head blocks (65-128 heads, 193-256, ...), at every row count. Measured (H200, V4 CSA / V4 HCA / V3.2):
# 2026-12-01 (bench_mla_variants.py), 0.77-0.86x the wg default's time from 64 rows, 0.90-0.97x at 32, slower below 16
# rows, so the default took them from 32 rows; 2026-12-02 (seventh session; NOTES.md "One head block, and the cluster
# pair at every row count"), after the pair's producer converts ahead, bench_targets.py's grid (each call cold, after
# FlashMLA's), h = 128: 1 row 19.0 / 19.8 / 21.2 us against the former defaults' 18.9 / 20.2 / 24.9 (first version for
# V4, ds for V3.2), 8 rows 24.0 / 28.1 / 32.6 against the wg kernels' 24.5 / 30.1 / 37.6.


def wgx_serves(h: int) -> bool:
    """Whether the wgt cluster kernels serve h heads: an even number of 64-head blocks (clusters of two)."""
    return h > 64 and -(-h // 64) % 2 == 0


def wgx_kernel_name(layout: str) -> str:
    return f"sparse_mla_wg_{layout}_t64x"


# "wge" kernels (V3.2 fp8, sm_90a; kernels/sparse_mla_decode/wge.cuh): the wg kernels' pipeline with the
# raw e4m3 values in an f16 tile and the fp32 tile scales applied to the fp32 partial S (one accumulator per
# 128-dim scale tile) and to P (relative to the largest scale seen, so P x scale stays within f16), exact for any
# fp32 scale, where the wg kernels round e4m3 x scale to bf16. No range limit on scales, q or RoPE. "_e_c2":
# warpgroup 1 converts half of each tile, as "_c2".
def wge_kernel_name() -> str:
    """The wge kernel the exact V3.2 choice takes (H200, 2026-12-01: V3.2 h=128 B=64 156.4 us against 169.8 for "_e_c2"
    and 282.7 for the ds kernel, at the ds kernels' accuracy on amax/448 scales; NOTES.md "wge kernels")."""
    return "sparse_mla_wg_v32_s3_e"


def exact_v32_kernel(h: int, rows: int | None, sm90: bool, entries: int | None = None, num_sms: int = 132) -> str:
    """The V3.2 fp8 kernel exact for any fp32 tile scale (SGLang's amax/448 included): the wge kernel where the fastest
    choice is a wg or cluster kernel from 8 rows (sm_90a, h >= 64), else the ds kernel (ds_kernel_name, with the rows'
    entry count; also at the 1-7 rows where more than 64 heads take a wg or cluster kernel by default: wge was not
    timed there). Formerly `fp32_scales_kernel`, what make_plan(fp32_scales=True) took."""
    if sm90 and h >= WG_MIN_HEADS and rows is not None and rows >= WG_MIN_ROWS:
        return wge_kernel_name()
    return ds_kernel_name("v32", h, rows, entries, num_sms)


def default_fp8_kernel(layout: str, h: int, rows: int | None, num_sms: int, sm90: bool = False,
                       entries: int | None = None, lossy_bf16_dequant: bool = False) -> str | None:
    """THE fp8 kernel table, for the launcher's calls and plans and the SGLang plugin's alike: a wg or ds kernel name,
    or None for the first-version kernel of that shape. V4 (UE8M0 scales, powers of two: every kernel exact) and V3.2
    with the lossy opt-in: the fastest measured (auto_fp8_kernel); V3.2 otherwise: exact_v32_kernel."""
    if layout == "v32" and not lossy_bf16_dequant:
        return exact_v32_kernel(h, rows, sm90, entries, num_sms)
    return auto_fp8_kernel(layout, h, rows, num_sms, sm90, entries)


def applies_scales_exactly(info: KernelInfo) -> bool:
    """Whether `info`'s kernel is exact on any fp32 scale: it never rounds a dequantized cache value (e4m3 x scale) to
    bf16. True for V4 (its UE8M0 scales are powers of two, so e4m3 x scale is a bf16 value) and bf16 KV (no scales);
    for V3.2 FP8 (fp32 scales per 128-value tile) only the ds kernels (the scale multiplies the fp32 partial S; PV
    runs on e4m3 x scale in f16, 11 significant bits) and the wge kernels (metadata "exact_scales"). The others
    convert e4m3 x scale into one bf16 tile: exact for power-of-two scales only."""
    if info.family == "combine" or info.shape.get("layout") != "v32":
        return True
    return info.family == "ds" or bool(info.shape.get("exact_scales"))


# The split combine reading at most 8 splits per round trip (fewer registers, more CTAs per SM) where one round trip
# covers the splits: NOTES.md "One row, and the heads between 16 and 64".
COMBINE_B8_MAX_SPLITS = _threshold("combine_b8_max_splits")

# PDSERVE_SPARSE_MLA_FUSE_COMBINE=1: the ds kernels' last split CTA merges the splits by default too (fuses_by_default).
FUSE_COMBINE = os.environ.get("PDSERVE_SPARSE_MLA_FUSE_COMBINE", "0") == "1"


def find_fatbin() -> pathlib.Path:
    return locate_fatbin("sparse_mla_decode", "PDSERVE_SPARSE_MLA_FATBIN")


def load_kernel_table(fatbin: str | os.PathLike | None = None) -> KernelTable:
    """The metadata of `fatbin` (default: find_fatbin()), from the .json the build wrote next to it."""
    return load_table(metadata_path(fatbin or find_fatbin()), "sparse_mla_decode")


def fuses_by_default(info: KernelInfo, splits: int) -> bool:
    """fuse_combine=None: where the merge in the main kernel measured faster than the combine kernel, the wg kernels'
    split pairs (the _m variants, which make_plan takes for two splits: H200, 0.79-0.91x at B=64 h=64, NOTES.md
    "Split pairs merged in the kernel"); the ds kernels' last-CTA combine (measured slower) only with
    PDSERVE_SPARSE_MLA_FUSE_COMBINE=1."""
    return fused_counters_per_block(info, splits) > 0 and (info.family != "ds" or FUSE_COMBINE)


def fused_counters_per_block(info: KernelInfo, splits: int) -> int:
    """The int32 counters per (row, head block) with which `info`'s kernel merges `splits` splits itself
    (fuse_combine), 0 where it cannot: the ds kernels any number (the last CTA of a row reads every partial: one
    arrival counter), the wg kernels whose epilogue merges split pairs (metadata "merges_split_pairs") exactly two
    (the second of each pair of consumer warps merges the first's partial: two counters for each of the 8 warps)."""
    if splits < 2:
        return 0
    if info.family == "ds":
        return 1
    return 16 if info.shape.get("merges_split_pairs") and splits == 2 else 0


def kernel_shape(info: KernelInfo) -> tuple[str, int, int]:
    """(layout, heads per CTA, entries per tile) of a kernel of the module (not the combine)."""
    return info.shape["layout"], info.shape["heads"], info.shape["tile"]


@dataclass(frozen=True)
class MlaPlan:
    """The launch of one sparse MLA decode call, from what the caller knows before the step (no tensor is
    read): layout, rows (batch x next_n), heads and indices per row. The same plan serves every layer."""

    layout: str           # "v4", "v32", "v4_bf16", "v32_bf16"
    rows: int
    h: int
    topk: int
    topk_extra: int
    kernel: str
    splits: int
    per_split: int        # entries per split CTA (a multiple of the kernel's tile)
    heads_per_cta: int
    threads: int
    smem: int
    fuse_combine: bool = False
    counters_per_block: int = 0   # fused: zero-kept int32 counters per (row, head block) (fused_counters_per_block)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.splits, -(-self.h // self.heads_per_cta), self.rows)

    @property
    def counter_ints(self) -> int:
        """Zero-kept int32 counters a fused plan needs (0 unfused)."""
        return self.rows * -(-self.h // self.heads_per_cta) * self.counters_per_block if self.fuse_combine else 0

    @property
    def partial_floats(self) -> int:
        """fp32 scratch for the split partials (o [rows, splits, h, 512], then lse [rows, splits, h]); 0 without
        splits."""
        return self.rows * self.splits * self.h * (DV + 1) if self.splits > 1 else 0

    @property
    def workspace_floats(self) -> int:
        """The op's workspace (ops.MlaWorkspace): the partials, then the counters at its end (int32 in fp32 slots)."""
        return self.partial_floats + self.counter_ints


class SparseMlaDecode(DeviceKernels):
    """The loaded module for one device; call it like the function (see the module docstring)."""

    def __init__(self, device=None, fatbin: str | os.PathLike | None = None) -> None:
        super().__init__(device, pathlib.Path(fatbin) if fatbin else find_fatbin(), load_kernel_table, _Params)
        self.smem_limit = int(getattr(self.props, "shared_memory_per_block_optin", 0) or 232448)
        self.module = Module(self.path.read_bytes(), self.device.index,
                             {n: self.smem_limit if k.smem_bytes(1) else 0 for n, k in self.kernels.kernels.items()})
        self._counter_bufs: dict[int, object] = {}

    def _counters(self, n: int):
        """Zeroed int32 arrival counters (>= n) for the fused combine, kept per stream: every launch leaves
        them at zero again, so reuse on the same stream is ordered; a new stream gets its own buffer."""
        torch = self.torch
        stream = torch.cuda.current_stream(self.device)
        key = stream.cuda_stream
        buf = self._counter_bufs.get(key)
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=self.device)
            self._counter_bufs[key] = buf
        return buf

    def _check_layout(self, layout: str) -> None:
        """Raise unless this fatbin has kernels for `layout` (a LAYOUTS name; layout_refusal says why not)."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        # only a tuning-only layout needs the table: the others are in every build, and the kernel choice's own tests
        # ask pick_kernel for them on launchers without one (tests/kernels/test_sparse_mla_launcher.py)
        refusal = layout_refusal(layout, self.kernels) if layout in TUNING_ONLY_LAYOUTS else None
        if refusal is not None:
            raise ValueError(refusal)

    def pick_kernel(self, layout: str, h: int, small: bool | None = None, variant: str | None = None,
                    rows: int | None = None, entries: int | None = None, lossy_bf16_dequant: bool = False) -> str:
        """The kernel for `layout` ("v4", "v32", "v4_bf16", "v32_bf16"), h heads, `rows` query rows and `entries`
        indices per row (topk + topk_extra; None: unknown, as for a plan made before the step knows it).

        First-version kernels: heads per CTA = the smallest of 16/32/64 covering h (h > 64: blocks of 64);
        `small` (default on GPUs with < 200 KB of shared memory per block, e.g. sm_120) takes the 16-head,
        32-entry variant. fp8 `variant` (default FP8_VARIANT): "auto" (default_fp8_kernel: exact unless
        `lossy_bf16_dequant`), "" (first version), "ds" (ds_kernel_name), "wg" / "wgh" / "wge" / "wgx" (sm_90a only,
        else "auto"; "wgh": the f16-tile wg kernels, tuning fatbin only;
        "wge": the exact-scale V3.2 kernel, for V4, whose UE8M0 scales are powers of two, the default wg kernel;
        "wgx": the wgt cluster kernel where it serves h (wgx_serves), else the default wg kernel).
        The ds and wg kernels need > 99 KB of shared memory: never `small`. A V3.2 kernel that rounds e4m3 x scale
        (applies_scales_exactly) is named here whatever `lossy_bf16_dequant` says; make_plan refuses it without."""
        self._check_layout(layout)
        if small is None:
            small = self.smem_limit < 200 * 1024
        base = layout.split("_")[0]
        suffix = "" if LAYOUTS[layout].bf16 else (FP8_VARIANT if variant is None else variant)
        if suffix not in ("", "auto", "ds", "wg", "wgh", "wge", "wgx"):
            raise ValueError(f"fp8 variant must be one of 'auto', '', 'ds', 'wg', 'wgh', 'wge', 'wgx', got {suffix!r}"
                             + (" (PDSERVE_SPARSE_MLA_FP8_OPT)" if variant is None else ""))
        if suffix in ("wg", "wgh", "wge", "wgx"):   # sm_90a only (wgmma); elsewhere the default choice
            if self.capability[0] == 9 and not small:
                if suffix == "wgh":
                    return f"sparse_mla_wg_{base}_s3_h"
                if suffix == "wgx" and wgx_serves(h):
                    return wgx_kernel_name(base)
                return wge_kernel_name() if suffix == "wge" and base == "v32" else wg_kernel_name(base)
            suffix = "auto"
        if suffix in ("auto", "ds"):
            name = None
            if not small:
                name = (ds_kernel_name(base, h, rows, entries, self.num_sms) if suffix == "ds"
                        else default_fp8_kernel(base, h, rows, self.num_sms, self.capability[0] == 9, entries,
                                                lossy_bf16_dequant))
            if name is not None:
                return name
            suffix = ""
        if small:
            shape = "h16_t32"
        elif h <= 16:
            shape = "h16_t64"
        elif h <= 32:
            shape = "h32_t64"
        else:
            shape = "h64_t64" if base == "v4" else "h64_t32"
        return f"sparse_mla_{_PREFIX[layout]}_{shape}{suffix}"

    def ctas_per_sm(self, name: str, per_split: int) -> int:
        """CTAs of `name` that fit on one SM with this split's shared memory (driver occupancy query)."""
        key = (name, per_split)
        if key not in self._occ:
            k = self.kernels[name]
            self._occ[key] = max(1, self.module.max_active_blocks(name, k.threads, k.smem_bytes(per_split)))
        return self._occ[key]

    def plan(self, name: str, rows: int, h: int, ntot: int, splits: int | None = None) -> tuple[int, int]:
        """(splits, per_split): split each row's entries when rows x head blocks would not fill the GPU
        (the ds kernels: fill every CTA slot the occupancy allows, e.g. two per SM for the 32-entry ones)."""
        k = self.kernels[name]
        _, hb, T = kernel_shape(k)
        ctas = rows * -(-h // hb)
        tiles = max(1, -(-ntot // T))
        slots = self.num_sms * (self.ctas_per_sm(name, T) if k.family == "ds" else 1)
        if splits is None:
            splits = max(1, min(slots // ctas, tiles, 64)) if ctas < slots else 1
        splits = max(1, min(int(splits), tiles))
        per_split = -(-tiles // splits) * T
        splits = max(1, -(-ntot // per_split))
        while k.smem_bytes(per_split) > self.smem_limit and per_split > T:
            per_split -= T
            splits = -(-ntot // per_split)
        if k.smem_bytes(per_split) > self.smem_limit:
            raise ValueError(f"{name} needs {k.smem_bytes(per_split)} B of shared memory, this GPU allows "
                             f"{self.smem_limit}")
        return splits, per_split

    def make_plan(self, layout: str, rows: int, h: int, topk: int, topk_extra: int = 0, *, kernel: str | None = None,
                  variant: str | None = None, small: bool | None = None, splits: int | None = None,
                  fuse_combine: bool | None = None, page: int = 64, lossy_bf16_dequant: bool = False,
                  pair_variant: bool | None = None) -> MlaPlan:
        """The MlaPlan for `rows` query rows of h heads with topk (+ topk_extra) indices each in `layout`
        (a bf16 layout name for bf16 KV). V4 with page 1 takes the first-version kernels (the ds and wg
        kernels may read 8 bytes past a page-1 entry: see __call__). Exact by default: a kernel that rounds
        e4m3 x fp32 scale to bf16 (V3.2's first-version, wg, wgt and cluster kernels: applies_scales_exactly) is
        refused, chosen or named, unless `lossy_bf16_dequant=True` (the faster lossy path; measured error on SGLang's
        amax/448 scales in NOTES.md "Exact by default"). `fuse_combine`: None (default)
        merges the splits in the kernel where that measured faster (fuses_by_default), True wherever the kernel can,
        False never. `pair_variant` (default: when `kernel` is None) lets two splits of a wg kernel take its "_m"
        variant, which merges them itself."""
        self._check_layout(layout)
        for name, v in (("rows", rows), ("h", h)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if topk < 0 or topk_extra < 0 or topk + topk_extra < 1:
            raise ValueError("at least one index per row is needed (topk + topk_extra >= 1)")
        name = kernel or self.pick_kernel(layout, h, small, variant, rows, topk + topk_extra, lossy_bf16_dequant)
        info = self.kernels.kernels.get(name)
        if (info is not None and info.family in ("ds", "wg") and layout == "v4" and page == 1 and kernel is None):
            name = self.pick_kernel(layout, h, small, "")
            info = self.kernels.kernels.get(name)
        if info is None or info.family == "combine" or kernel_shape(info)[0] != layout:
            known = sorted(n for n, k in self.kernels.kernels.items() if k.family != "combine")
            raise ValueError(f"kernel {name!r} is not a {layout} kernel of {self.kernels.path.name} ({known}; "
                             "kernels no shape chooses are in the tuning build only, kernels/tuning/build.sh)")
        if info.family == "wg" and self.capability[0] != 9:
            major, minor = self.capability
            raise ValueError(f"kernel {name!r} needs an sm_90a GPU (wgmma); this one is sm_{major}{minor}")
        pair = info.shape.get("cluster_head_blocks", 1)
        if -(-h // kernel_shape(info)[1]) % pair:
            raise ValueError(f"kernel {name!r} runs in clusters of {pair} head blocks of {kernel_shape(info)[1]}: "
                             f"h={h} gives {-(-h // kernel_shape(info)[1])}; use an h it serves or another kernel")
        if not lossy_bf16_dequant and not applies_scales_exactly(info):
            raise ValueError(self._lossy_refusal(name, small))
        n_splits, per_split = self.plan(name, rows, h, topk + topk_extra, splits)
        # pair_variant (default: when the kernel is the launcher's choice): two splits of a kernel with a split-pair
        # variant (the same kernel merging them itself, name + "_m") take that variant unless fuse_combine=False.
        pairs = self.kernels.kernels.get(name + "_m")
        if ((kernel is None if pair_variant is None else pair_variant) and fuse_combine is not False
                and pairs is not None and fused_counters_per_block(pairs, n_splits) > 0):
            name, info = name + "_m", pairs
        return MlaPlan(layout=layout, rows=rows, h=h, topk=topk, topk_extra=topk_extra, kernel=name, splits=n_splits,
                       per_split=per_split, heads_per_cta=kernel_shape(info)[1], threads=info.threads,
                       smem=info.smem_bytes(per_split),
                       fuse_combine=(fuses_by_default(info, n_splits) if fuse_combine is None
                                     else bool(fuse_combine) and fused_counters_per_block(info, n_splits) > 0),
                       counters_per_block=fused_counters_per_block(info, n_splits))

    def _lossy_refusal(self, name: str, small: bool | None) -> str:
        """Why make_plan refuses `name` without the lossy opt-in, and what to do instead."""
        what = (f"kernel {name!r} rounds each e4m3 value times its fp32 tile scale to bf16: exact only for "
                "power-of-two scales, not for SGLang's amax/448 ones")
        if small if small is not None else self.smem_limit < 200 * 1024:
            how = (f"no V3.2 FP8 kernel exact for fp32 scales fits this GPU ({self.smem_limit} B of shared memory "
                   "per block; the ds and wge kernels need more than 99 KB)")
        else:
            how = "name an exact kernel (ds, wge) or let the launcher choose (its default is exact)"
            if FP8_VARIANT not in ("auto", "ds", "wge"):
                how += f"; PDSERVE_SPARSE_MLA_FP8_OPT={FP8_VARIANT!r} asks for another"
        return f"{what}; {how}, or pass lossy_bf16_dequant=True to accept the rounding"

    def launch(self, plan: MlaPlan, q4, kv, ind3, sm_scale: float, *, sinks, extra_kv, e3, out, lse,
               o_part_ptr: int | None, lse_part_ptr: int | None, counters_ptr: int | None = None,
               pdl: bool | None = None) -> None:
        """Queue one call on the current stream: no allocation, no host sync, no planning. The inputs must have
        passed _check and match `plan` (extra_kv / e3: the first source again when there is no second).
        `pdl` (default: on sm_90 and later): the split combine is a programmatic dependent launch, scheduled
        while the main kernel runs and waiting in-kernel for its partials (False: an ordinary launch after it,
        for timing the difference)."""
        page, stride, n_entries = _cache_geometry(self.torch, LAYOUTS[plan.layout], kv, "kv")
        epage, estride, en = _cache_geometry(self.torch, LAYOUTS[plan.layout], extra_kv, "extra_kv")
        p = _Params(
            q=q4.data_ptr(), kv=kv.data_ptr(), kv_extra=extra_kv.data_ptr(), indices=ind3.data_ptr(),
            indices_extra=e3.data_ptr(), sinks=sinks.data_ptr() if sinks is not None else None,
            out=out.data_ptr(), lse=lse.data_ptr(), o_part=o_part_ptr, lse_part=lse_part_ptr,
            block_stride=stride, block_stride_extra=estride, num_entries=n_entries, num_entries_extra=en,
            page_shift=page.bit_length() - 1, rows=plan.rows, h=plan.h, topk=plan.topk, topk_extra=plan.topk_extra,
            splits=plan.splits, per_split=plan.per_split, scale_log2=sm_scale * math.log2(math.e),
            page_shift_extra=epage.bit_length() - 1, counters=counters_ptr)
        stream = self.torch.cuda.current_stream(self.device).cuda_stream
        self.module.launch(plan.kernel, plan.grid, plan.threads, plan.smem, stream, p)
        if plan.splits > 1 and not plan.fuse_combine:
            # (builds before the 8-split combine have only the other)
            few = plan.splits <= COMBINE_B8_MAX_SPLITS and "sparse_mla_combine_b8" in self.kernels.kernels
            combine = self.kernels["sparse_mla_combine_b8" if few else "sparse_mla_combine"]
            use_pdl = self.capability[0] >= 9 if pdl is None else pdl
            self.module.launch(combine.name, (plan.h, plan.rows, 1), combine.threads, 0, stream, p,
                               programmatic=use_pdl)

    def __call__(self, q, kv, indices, sm_scale: float, *, layout: str = "v4", sinks=None, extra_kv=None,
                 extra_indices=None, out=None, lse=None, splits: int | None = None, kernel: str | None = None,
                 small: bool | None = None, variant: str | None = None, fuse_combine: bool | None = None,
                 pdl: bool | None = None, lossy_bf16_dequant: bool = False):
        torch = self.torch
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        if isinstance(kv, torch.Tensor) and kv.dtype == torch.bfloat16 and not LAYOUTS[layout].bf16:
            layout = layout + "_bf16"   # bf16 KV selects the bf16 kernels
        lay = LAYOUTS[layout]
        q4 = q if q.dim() == 4 else q.unsqueeze(1) if q.dim() == 3 else q
        ind3 = indices if indices.dim() == 3 else indices.unsqueeze(1) if indices.dim() == 2 else indices
        _check(torch, self.device, lay, q4, ind3, kv, "kv", "indices")
        B, next_n, h, _ = q4.shape
        rows = B * next_n
        page, stride, _ = _cache_geometry(torch, lay, kv, "kv")
        topk = ind3.shape[2]
        if extra_kv is not None or extra_indices is not None:
            if extra_kv is None or extra_indices is None:
                raise ValueError("extra_kv and extra_indices go together")
            e3 = extra_indices if extra_indices.dim() == 3 else extra_indices.unsqueeze(1)
            _check(torch, self.device, lay, q4, e3, extra_kv, "extra_kv", "extra_indices")
            epage, estride, _ = _cache_geometry(torch, lay, extra_kv, "extra_kv")
            topk_extra = e3.shape[2]
        else:
            e3, epage, estride, topk_extra = ind3, page, stride, 0
            extra_kv = kv
        if sinks is not None and (sinks.dtype != torch.float32 or tuple(sinks.shape) != (h,)
                                  or sinks.device != self.device or not sinks.is_contiguous()):
            raise ValueError(f"sinks must be a contiguous float32 tensor [{h}] on {self.device}")
        if not math.isfinite(sm_scale) or sm_scale <= 0:
            raise ValueError(f"sm_scale must be a positive finite float, got {sm_scale!r}")
        ntot = topk + topk_extra
        if ntot < 1:
            raise ValueError("at least one index per row is needed (topk + topk_extra >= 1)")

        name = kernel or self.pick_kernel(layout, h, small, variant, rows, ntot, lossy_bf16_dequant)
        family = self.kernels[name].family if name in self.kernels else None
        if family in ("ds", "wg") and layout == "v4" and 1 in (page, epage) and not (
                _covers(kv, stride, 592) and (topk_extra == 0 or _covers(extra_kv, estride, 592))):
            # The ds kernels copy V4's scale record as the 16-byte aligned pair holding it: with page 1 that
            # reads 8 bytes past the entry, which must still be inside the tensor's storage.
            name = self.pick_kernel(layout, h, small, "")
        plan = self.make_plan(layout, rows, h, topk, topk_extra, kernel=name, splits=splits, fuse_combine=fuse_combine,
                              pair_variant=kernel is None, lossy_bf16_dequant=lossy_bf16_dequant)
        if out is None:
            out = torch.empty((B, next_n, h, DV), dtype=torch.bfloat16, device=self.device)
        elif out.dtype != torch.bfloat16 or out.numel() != rows * h * DV or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor with {rows}x{h}x{DV} elements")
        if lse is None:
            lse = torch.empty((B, next_n, h), dtype=torch.float32, device=self.device)
        elif lse.dtype != torch.float32 or lse.numel() != rows * h or not lse.is_contiguous():
            raise ValueError(f"lse must be a contiguous float32 tensor with {rows}x{h} elements")
        ws = torch.empty(plan.partial_floats, dtype=torch.float32, device=self.device) if plan.splits > 1 else None
        counters = self._counters(plan.counter_ints) if plan.fuse_combine else None
        self.launch(plan, q4, kv, ind3, sm_scale, sinks=sinks, extra_kv=extra_kv, e3=e3, out=out, lse=lse,
                    o_part_ptr=ws.data_ptr() if ws is not None else None,
                    lse_part_ptr=ws.data_ptr() + 4 * rows * plan.splits * h * DV if ws is not None else None,
                    counters_ptr=counters.data_ptr() if counters is not None else None, pdl=pdl)
        # The workspace stays alive until the launches are queued (the caching allocator reuses it safely on
        # the same stream afterwards).
        del ws
        return out, lse


def _covers(kv, stride: int, need: int) -> bool:
    """kv's storage holds `need` bytes from the start of its last block (block stride `stride` bytes)."""
    start = kv.storage_offset() * kv.element_size()
    return start + (kv.shape[0] - 1) * stride + need <= kv.untyped_storage().nbytes()


def _cache_geometry(torch, lay, kv, name):
    page = kv.shape[1]
    if page < 1 or page & (page - 1):
        raise ValueError(f"{name}: page size (dim 1) must be a power of two, got {page}")
    elem = kv.element_size()
    stride = kv.stride(0) * elem
    if stride % 16:
        raise ValueError(f"{name}: block stride must be a multiple of 16 bytes, got {stride}")
    if stride < page * lay.entry_bytes:
        raise ValueError(f"{name}: block stride {stride} B is less than page x {lay.entry_bytes} B")
    n_entries = kv.shape[0] * page
    if n_entries >= 1 << 30:
        raise ValueError(f"{name}: at most 2^30 entries per cache, got {n_entries}")
    return page, stride, n_entries


def _check(torch, device, lay, q, ind, kv, kv_name, ind_name) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(msg)

    for name, t in (("q", q), (ind_name, ind), (kv_name, kv)):
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
        need(t.device == device, f"{name} is on {t.device}, expected {device}")
    need(q.dim() == 4 and q.shape[3] == lay.dqk,
         f"q must be [B, next_n, h, {lay.dqk}] or [B, h, {lay.dqk}] for layout {lay.name}, got {tuple(q.shape)}")
    need(q.dtype == torch.bfloat16, f"q must be bfloat16, got {q.dtype}")
    need(q.is_contiguous(), "q must be contiguous (call .contiguous())")
    need(q.data_ptr() % 16 == 0, "q must be 16-byte aligned")
    need(ind.dtype == torch.int32, f"{ind_name} must be int32, got {ind.dtype}")
    need(ind.dim() == 3 and tuple(ind.shape[:2]) == tuple(q.shape[:2]),
         f"{ind_name} must be [B, next_n, topk] matching q's [B, next_n] = {tuple(q.shape[:2])}, "
         f"got {tuple(ind.shape)}")
    need(ind.is_contiguous(), f"{ind_name} must be contiguous")
    if lay.bf16:
        need(kv.dtype == torch.bfloat16, f"{kv_name} must be bfloat16 for layout {lay.name}, got {kv.dtype}")
        last = lay.dqk
    else:
        fp8 = getattr(torch, "float8_e4m3fn", None)
        need(kv.dtype in (torch.uint8, fp8), f"{kv_name} must be uint8 or float8_e4m3fn bytes (or bfloat16 for "
             f"bf16 KV), got {kv.dtype}")
        last = lay.entry_bytes
    need(kv.dim() in (3, 4) and kv.shape[-1] == last and (kv.dim() == 3 or kv.shape[2] == 1),
         f"{kv_name} must be [num_blocks, page, 1, {last}] or [num_blocks, page, {last}] "
         f"for layout {lay.name}, got {tuple(kv.shape)}")
    need(kv.shape[0] >= 1 and kv[0].is_contiguous(),
         f"{kv_name}: dims after the first must be contiguous (one block = page x {lay.entry_bytes} bytes)")
    need(kv.data_ptr() % 16 == 0, f"{kv_name} must be 16-byte aligned")


_per_device: PerDevice[SparseMlaDecode] = PerDevice(SparseMlaDecode)


def sparse_mla_decode(q, kv, indices, sm_scale: float, **kw):
    """Functional form with one cached SparseMlaDecode per device. See the module docstring."""
    return _per_device.of(q.device)(q, kv, indices, sm_scale, **kw)
