"""GPU tests of the sparse MLA decode kernel against the fp32 PyTorch reference (marker `gpu`).

Fresh random inputs every run (seeded from the clock, printed on failure). Every cache entry that no row
selects holds NaN bytes (e4m3, scales and RoPE), so a kernel that reads outside its selection produces
NaN. Outputs are poisoned with NaN before each call, so every element must be written. Checks:
* o: relative L2 error against the reference <= 5e-3 overall and <= 1e-2 per (row, head) (bf16 P and a
  bf16 output give ~2e-3; an algorithm emulation in fp32/bf16 measured 1.6-2.2e-3);
* lse: |ours - ref| <= 1e-3 where finite; rows with no valid entry: o == 0 exactly and lse == +inf;
* no NaN anywhere.
A test that names a kernel or forces a family (kernel=, variant=) opts into the lossy path: these inputs' scales are
powers of two (unless a test says otherwise), where the kernels that round e4m3 x scale to bf16 are exact too; a
kernel retired from production (metadata "retired") runs from the tuning fatbin, which holds every kernel, and so does
every V4 bf16-KV case (a layout the production launcher refuses: its build is FP8-only for V4).
"""

import os
import pathlib
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU kernel tests need it")

pytestmark = pytest.mark.gpu

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mla():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    from pdserve_kernels.sparse_mla_decode import SparseMlaDecode

    fatbin = os.environ.get("PDSERVE_SPARSE_MLA_FATBIN")
    if not fatbin:
        built = REPO / "kernels" / "build" / "sparse_mla_decode.fatbin"
        if not built.is_file():
            if shutil.which("nvcc") is None:
                pytest.skip("no built fatbin and no nvcc to build one")
            subprocess.run(["bash", str(REPO / "kernels" / "build.sh")], check=True, timeout=900)
        fatbin = str(built)
    return SparseMlaDecode(fatbin=fatbin)


_TUNING = {}


def tuning_launcher():
    """The tuning fatbin's launcher (kernels/tuning/build.sh: the production kernels and the retired, experimental
    and probe ones), loaded once."""
    if "mla" not in _TUNING:
        from pdserve_kernels.sparse_mla_decode import SparseMlaDecode

        built = REPO / "kernels" / "build" / "sparse_mla_decode_tuning.fatbin"
        if not built.is_file():
            if shutil.which("nvcc") is None:
                pytest.skip("no tuning fatbin (kernels/tuning/build.sh) and no nvcc to build one")
            subprocess.run(["bash", str(REPO / "kernels" / "tuning" / "build.sh")], check=True, timeout=900)
        _TUNING["mla"] = SparseMlaDecode(fatbin=str(built))
    return _TUNING["mla"]


def run_and_check(mla, gen, layout, B, next_n, h, topk, *, topk_extra=0, empty_rows=(), invalid_frac=0.1,
                  sinks=True, sm_scale=None, call_layout=None, scale_factor=1.0, page=64, q_scale=1.0,
                  scale_mode="pow2", max_rel=5e-3, max_worst=1e-2, invalid_span=None, extra_page=None, **kw):
    from pdserve_kernels.sparse_mla_decode import layout_refusal
    from pdserve_kernels.sparse_mla_reference import LAYOUTS, make_inputs, reference_from_inputs

    if layout_refusal(layout, mla.kernels) is not None:   # V4's bf16 KV: the tuning fatbin's kernels
        mla = tuning_launcher()
    forced = "kernel" in kw or "variant" in kw
    kw.setdefault("lossy_bf16_dequant", forced)
    if forced:
        name = kw.get("kernel") or mla.pick_kernel(call_layout or layout, h, kw.get("small"), kw.get("variant"),
                                                   B * next_n, topk + topk_extra, kw["lossy_bf16_dequant"])
        if name not in mla.kernels:   # retired from production
            mla = tuning_launcher()

    inp = make_inputs(layout, B, next_n, h, topk, topk_extra=topk_extra, empty_rows=empty_rows,
                      invalid_frac=invalid_frac, sinks=sinks, generator=gen, scale_factor=scale_factor, page=page,
                      scale_mode=scale_mode, extra_page=extra_page)
    if invalid_span is not None:   # indices lo..hi-1 of every row -1: whole splits empty between full ones
        lo, hi = invalid_span
        inp["indices"][:, :, lo:hi] = -1
    if q_scale != 1.0:   # a power of two: exact in bf16
        inp["q"] = (inp["q"].float() * q_scale).to(torch.bfloat16)
    sm_scale = sm_scale or LAYOUTS[layout].dqk ** -0.5
    out = torch.full((B, next_n, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, next_n, h), float("nan"), dtype=torch.float32, device="cuda")
    extra = dict(extra_kv=inp["extra_kv"], extra_indices=inp["extra_indices"]) if topk_extra else {}
    mla(inp["q"], inp["kv"], inp["indices"], sm_scale, layout=call_layout or layout, sinks=inp["sinks"], out=out,
        lse=lse, **extra, **kw)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference_from_inputs(inp, sm_scale)
    o = out.float()
    assert not torch.isnan(o).any(), "NaN in the output: an unwritten element or a read outside the selection"
    assert not torch.isnan(lse).any(), "NaN in lse: an unwritten element or a read outside the selection"
    lonely = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse > 0), lonely), "lse = +inf exactly for the rows with no valid entry"
    assert (o[lonely] == 0).all(), "rows with no valid entry must give o = 0"
    fin = ~lonely
    if fin.any():
        dl = (lse[fin] - ref_lse[fin]).abs().max().item()
        assert dl <= 1e-3, f"lse differs by {dl}"
        num = (o - ref_o)[fin].norm(dim=-1)
        den = ref_o[fin].norm(dim=-1).clamp_min(1e-30)
        rel = (num.norm() / den.norm()).item()
        worst = (num / den).max().item()
        assert rel <= max_rel, f"relative error {rel:.3e} (worst row-head {worst:.3e})"
        assert worst <= max_worst, f"worst row-head relative error {worst:.3e} (overall {rel:.3e})"
    return out, lse


@pytest.mark.parametrize("h", [8, 16, 32, 64, 128])
def test_v4_csa_window_plus_selected(mla, gen, h):
    # V4-Flash CSA: 512 selected compressed entries + 128 window entries from a second cache.
    run_and_check(mla, gen, "v4", 3, 1, h, 512, topk_extra=128, empty_rows=(1,))


@pytest.mark.parametrize("h", [16, 32, 64, 128])
def test_v32_top2048(mla, gen, h):
    run_and_check(mla, gen, "v32", 2, 1, h, 2048, empty_rows=(1,))


@pytest.mark.parametrize("layout,topk,extra", [("v4", 1, 0), ("v4", 31, 7), ("v4", 100, 33), ("v4", 1025, 0),
                                               ("v32", 33, 0), ("v32", 333, 0), ("v32", 2047, 0)])
def test_lengths_not_multiple_of_tile(mla, gen, layout, topk, extra):
    run_and_check(mla, gen, layout, 2, 1, 16, topk, topk_extra=extra)
    run_and_check(mla, gen, layout, 2, 1, 64, topk, topk_extra=extra)


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_split_kv_and_empty_rows(mla, gen, splits):
    # Rows 0 and 2 all -1; splits > 1 goes through the combine kernel (empty splits have lse = -inf).
    run_and_check(mla, gen, "v4", 4, 1, 16, 512, topk_extra=128, empty_rows=(0, 2), splits=splits)
    run_and_check(mla, gen, "v32", 3, 1, 64, 2048, empty_rows=(2,), splits=splits)


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("layout,kernel,topk,extra,span,splits", [
    ("v32", "sparse_mla_ds_v32_h16_t32_s4", 2048, 0, (256, 1536), 22),   # 22 splits of 96: a partial batch
    ("v32", "sparse_mla_ds_v32_h16_t32_s4", 2048, 0, (256, 1536), 64),   # four full batches
    ("v4", "sparse_mla_v4_h16_t64", 1024, 128, (64, 900), 18),           # first-version kernel, 18 splits
])
def test_combine_batches_with_empty_splits_between(mla, gen, layout, kernel, topk, extra, span, splits, pdl):
    # The combine reads the splits 16 at a time into a running maximum: split counts that leave a partial
    # last batch, and a run of empty splits (lse -inf, partial never written) between non-empty ones, in the
    # programmatic (default on sm_90) and the ordinary launch.
    plan = mla.make_plan(layout, 2, 16, topk, extra, kernel=kernel, splits=splits)
    assert plan.splits == splits and plan.splits > 16, plan
    run_and_check(mla, gen, layout, 2, 1, 16, topk, topk_extra=extra, invalid_span=span, splits=splits, pdl=pdl,
                  kernel=kernel)


def test_mostly_invalid_indices(mla, gen):
    # 90% -1: whole tiles and whole splits without a valid entry.
    run_and_check(mla, gen, "v4", 4, 1, 32, 512, topk_extra=128, invalid_frac=0.9)
    run_and_check(mla, gen, "v32", 2, 1, 16, 2048, invalid_frac=0.95)


def test_next_n_2_and_sharp_scale_no_sinks(mla, gen):
    run_and_check(mla, gen, "v4", 2, 2, 64, 512, topk_extra=128, sinks=False, sm_scale=0.13523)
    run_and_check(mla, gen, "v32", 2, 2, 32, 2048, sinks=False, sm_scale=0.13523)


@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_small_smem_variant(mla, gen, layout):
    # The 16-head, 32-entry kernels are what sm_120 (99 KB of shared memory per block) runs; check them here. V3.2's
    # rounds e4m3 x scale to bf16 (these scales are powers of two): the default refuses it, the opt-in runs it.
    # Where the GPU itself is small (sm_120) the launcher finds no exact kernel that fits; on sm_90 `small`
    # names the rounding kernel, which make_plan refuses by name. Either refusal is the exact default at work.
    lossy = layout == "v32"
    if lossy:
        refused = ("no V3.2 FP8 kernel exact for fp32 scales fits"
                   "|rounds each e4m3 value times its fp32 tile scale to bf16")
        with pytest.raises(ValueError, match=refused):
            run_and_check(mla, gen, layout, 3, 1, 64, 2048, small=True)
    run_and_check(mla, gen, layout, 3, 1, 64, 512 if layout == "v4" else 2048,
                  topk_extra=128 if layout == "v4" else 0, empty_rows=(1,), small=True, lossy_bf16_dequant=lossy)


# ---- fp8: the first-version kernels stay selectable and correct next to the default ----

def test_fp8_first_version_kernels(mla, gen):
    variant = ""
    run_and_check(mla, gen, "v4", 3, 1, 16, 512, topk_extra=128, empty_rows=(1,), variant=variant)
    run_and_check(mla, gen, "v4", 2, 1, 64, 100, topk_extra=33, variant=variant)
    run_and_check(mla, gen, "v32", 2, 1, 32, 2047, empty_rows=(0,), variant=variant, splits=3)
    run_and_check(mla, gen, "v32", 2, 1, 128, 333, variant=variant)
    run_and_check(mla, gen, "v4", 3, 1, 64, 512, topk_extra=128, empty_rows=(1,), small=True, variant=variant)


def test_v32_scales_not_powers_of_two(mla, gen):
    # fp32 scales x (1 + 2^-20), not powers of two: the first-version kernels multiply them in fp32.
    run_and_check(mla, gen, "v32", 2, 1, 16, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, variant="")
    run_and_check(mla, gen, "v32", 2, 1, 64, 300, scale_factor=1 + 2 ** -20, variant="")


# ---- ds kernels (fp8; warps split the head dim, e4m3 converted inside the MMA operands, f16 PV) ----

@pytest.mark.parametrize("h", [8, 16, 32, 64, 128])
def test_ds_v4_csa_window_plus_selected(mla, gen, h):
    run_and_check(mla, gen, "v4", 3, 1, h, 512, topk_extra=128, empty_rows=(1,), variant="ds")


@pytest.mark.parametrize("h", [16, 32, 128])
def test_ds_v32_top2048(mla, gen, h):
    run_and_check(mla, gen, "v32", 2, 1, h, 2048, empty_rows=(1,), variant="ds")


@pytest.mark.parametrize("layout,topk,extra", [("v4", 1, 0), ("v4", 31, 7), ("v4", 100, 33), ("v4", 1025, 0),
                                               ("v32", 33, 0), ("v32", 333, 0), ("v32", 2047, 0)])
def test_ds_lengths_not_multiple_of_tile(mla, gen, layout, topk, extra):
    run_and_check(mla, gen, layout, 2, 1, 16, topk, topk_extra=extra, variant="ds")
    run_and_check(mla, gen, layout, 2, 1, 64, topk, topk_extra=extra, variant="ds")


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("splits", [1, 3, 16])
def test_ds_split_kv_empty_rows_mostly_invalid(mla, gen, splits, fuse):
    # fuse: the last split CTA merges the splits (no combine launch); twice in a row, so the counters it
    # leaves behind must be zero again.
    for _ in range(2 if fuse else 1):
        run_and_check(mla, gen, "v4", 4, 1, 16, 512, topk_extra=128, empty_rows=(0, 2), splits=splits,
                      variant="ds", fuse_combine=fuse)
        run_and_check(mla, gen, "v32", 3, 1, 32, 2048, empty_rows=(2,), splits=splits, variant="ds",
                      fuse_combine=fuse)
    run_and_check(mla, gen, "v4", 2, 1, 32, 512, topk_extra=128, invalid_frac=0.9, splits=splits, variant="ds",
                  fuse_combine=fuse)
    run_and_check(mla, gen, "v32", 2, 1, 16, 2048, invalid_frac=0.95, splits=splits, variant="ds",
                  fuse_combine=fuse)
    run_and_check(mla, gen, "v4", 3, 2, 48, 512, topk_extra=128, empty_rows=(1,), splits=splits, variant="ds",
                  fuse_combine=fuse, sinks=False)


def test_ds_next_n_2_no_sinks_pages_q_range(mla, gen):
    run_and_check(mla, gen, "v4", 2, 2, 64, 512, topk_extra=128, sinks=False, sm_scale=0.13523, variant="ds")
    run_and_check(mla, gen, "v32", 2, 2, 32, 2048, sinks=False, sm_scale=0.13523, variant="ds")
    # page 1 and 2: the V4 scale record is the first or second half of the 16-byte pair the kernel copies
    run_and_check(mla, gen, "v4", 2, 1, 16, 300, topk_extra=40, page=1, variant="ds")
    run_and_check(mla, gen, "v4", 2, 1, 16, 300, topk_extra=40, page=2, variant="ds")
    # q far outside f16's range (and tiny): the per-head power-of-two rescale keeps QK exact
    run_and_check(mla, gen, "v4", 2, 1, 16, 512, topk_extra=128, q_scale=2.0 ** 20, sm_scale=2.0 ** -26,
                  variant="ds")
    run_and_check(mla, gen, "v32", 2, 1, 32, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, variant="ds")
    # fp32 scales that are not powers of two (V3.2): rounded to f16 for PV only
    run_and_check(mla, gen, "v32", 2, 1, 16, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, variant="ds")


@pytest.mark.parametrize("layout,topk,extra", [("v4", 512, 128), ("v32", 2048, 0)])
def test_default_kernel_at_64_rows(mla, gen, layout, topk, extra):
    # rows >= 64: the default ("auto") takes the ds kernels with their own split planning
    run_and_check(mla, gen, layout, 64, 1, 16, topk, topk_extra=extra, empty_rows=(5,))
    run_and_check(mla, gen, layout, 32, 2, 64, topk, topk_extra=extra, invalid_frac=0.3)


# SGLang's V4 decode (../shared/facts/sglang-dsv4.md §5): the window cache at page 256 (128 entries per row) with the
# C4 cache at page 64 (the indexer's 512) or the C128 cache at page 2 (every compressed entry), in one launch.
V4_SOURCES = [(256, 128, 64, 512), (256, 128, 2, 128), (256, 128, 2, 64), (64, 128, 256, 512), (2, 40, 64, 100)]


@pytest.mark.parametrize("page,topk,extra_page,extra", V4_SOURCES)
@pytest.mark.parametrize("variant,h", [("", 16), ("ds", 16), ("ds", 64), ("wg", 64), ("wgx", 128), ("auto", 16),
                                       ("auto", 64)])
@pytest.mark.parametrize("splits", [None, 3])
def test_v4_two_sources_paged_differently(mla, gen, page, topk, extra_page, extra, variant, h, splits):
    if variant in ("wg", "wgx") and mla.capability[0] != 9:
        pytest.skip("the wg kernels need sm_90a")
    if variant == "wgx" and splits:
        pytest.skip("the cluster pair plans its own two splits")
    kw = {} if variant == "auto" else dict(variant=variant)
    run_and_check(mla, gen, "v4", 3, 1, h, topk, topk_extra=extra, page=page, extra_page=extra_page,
                  empty_rows=(1,), splits=splits, **kw)
    run_and_check(mla, gen, "v4", 2, 1, h, topk, topk_extra=extra, page=page, extra_page=extra_page,
                  invalid_frac=0.6, splits=splits, **kw)


def test_ds_every_kernel(mla, mla_tuning, gen):
    # production's ds kernels and the retired ones (tuning fatbin), from the fatbins' metadata
    ds = {n: k for n, k in mla_tuning.kernels.family("ds").items() if not k.shape.get("experimental")}
    assert len(ds) == 16 and set(mla.kernels.family("ds")) <= set(ds) and len(mla.kernels.family("ds")) == 5
    for name, info in ds.items():
        layout, hb = info.shape["layout"], info.shape["heads"]
        h = 8 if hb == 16 else 48   # half-used head blocks too
        if layout == "v4":
            run_and_check(mla, gen, "v4", 3, 1, h, 512, topk_extra=128, empty_rows=(1,), kernel=name)
            run_and_check(mla, gen, "v4", 2, 1, hb, 100, topk_extra=33, kernel=name, splits=3)
            run_and_check(mla, gen, "v4", 2, 1, hb, 512, topk_extra=128, kernel=name, fuse_combine=True)
        else:
            run_and_check(mla, gen, "v32", 2, 1, h, 2047, empty_rows=(0,), kernel=name, splits=3)
            run_and_check(mla, gen, "v32", 2, 1, hb, 333, kernel=name, invalid_frac=0.5)
            run_and_check(mla, gen, "v32", 2, 1, hb, 2048, kernel=name, fuse_combine=True)



# ---- wg kernels (sm_90a: wgmma, 64 heads per CTA, producer + two consumer warpgroups) ----

@pytest.fixture()
def sm90(mla):
    if mla.capability[0] != 9:
        pytest.skip(f"the wg kernels need sm_90a; this GPU is sm_{mla.capability[0]}{mla.capability[1]}")


@pytest.mark.parametrize("h", [64, 96, 128])
def test_wg_v4_csa_window_plus_selected(mla, gen, sm90, h):
    run_and_check(mla, gen, "v4", 3, 1, h, 512, topk_extra=128, empty_rows=(1,), variant="wg")


@pytest.mark.parametrize("h", [64, 128])
def test_wg_v32_top2048(mla, gen, sm90, h):
    run_and_check(mla, gen, "v32", 2, 1, h, 2048, empty_rows=(1,), variant="wg")


@pytest.mark.parametrize("variant,B,h", [("wg", 2, 72), ("wg", 2, 100), ("wgx", 2, 100)])
@pytest.mark.parametrize("splits", [None, 3])
def test_wg_heads_past_h_inside_a_warp(mla, gen, sm90, variant, B, h, splits):
    # h not a multiple of 16: a warp's last head rows hold heads at and past h, which skip the epilogue's stores
    # (and the quad shuffles before them) while the warp's other rows write theirs; one split writes bf16 rows,
    # three the fp32 partials.
    run_and_check(mla, gen, "v4", B, 1, h, 512, topk_extra=128, empty_rows=(1,), variant=variant, splits=splits)


@pytest.mark.parametrize("layout,topk,extra", [("v4", 1, 0), ("v4", 31, 7), ("v4", 100, 33), ("v4", 1025, 0),
                                               ("v32", 33, 0), ("v32", 333, 0), ("v32", 2047, 0)])
def test_wg_lengths_not_multiple_of_tile(mla, gen, sm90, layout, topk, extra):
    run_and_check(mla, gen, layout, 2, 1, 64, topk, topk_extra=extra, variant="wg")


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_wg_split_kv_empty_rows_mostly_invalid(mla, gen, sm90, splits):
    run_and_check(mla, gen, "v4", 3, 1, 64, 512, topk_extra=128, empty_rows=(1,), splits=splits, variant="wg")
    run_and_check(mla, gen, "v32", 3, 1, 128, 2048, empty_rows=(2,), splits=splits, variant="wg")
    run_and_check(mla, gen, "v4", 2, 1, 64, 512, topk_extra=128, invalid_frac=0.9, splits=splits, variant="wg")
    run_and_check(mla, gen, "v32", 2, 1, 64, 2048, invalid_frac=0.95, splits=splits, variant="wg")


# Every kernel that merges split pairs in its epilogue (metadata "merges_split_pairs"), with the head count its
# cases run at: the cluster pair (_t64x_m) serves two head blocks per cluster. wg_v32_s3_c2_m is retired (tuning).
SPLIT_PAIR_KERNELS = [("sparse_mla_wg_v4_s3_m", 64), ("sparse_mla_wg_v32_s3_c2_m", 64),
                      ("sparse_mla_wg_v32_t64c_m", 64), ("sparse_mla_wg_v4_t64x_m", 128),
                      ("sparse_mla_wg_v32_t64x_m", 128)]


def test_split_pair_kernels_are_every_merging_kernel(mla, mla_tuning):
    merging = {n for n, k in mla_tuning.kernels.kernels.items()
               if k.shape.get("merges_split_pairs") and not k.shape.get("experimental") and not k.shape.get("probe")}
    assert merging == {n for n, _ in SPLIT_PAIR_KERNELS}
    assert {n for n, k in mla.kernels.kernels.items() if k.shape.get("merges_split_pairs")} == \
        merging - {"sparse_mla_wg_v32_s3_c2_m"}


@pytest.mark.parametrize("kernel,h", SPLIT_PAIR_KERNELS)
def test_wg_split_pairs_merged_in_the_kernel(request, mla, gen, sm90, kernel, h):
    # The _m kernels with two splits: the second of each pair of consumer warps merges the first's partial, no
    # combine launch (the launcher's default for two splits of these kernels). Twice in a row (the counters must
    # be left at zero), a warp with heads past h, empty rows, mostly invalid entries, next_n = 2 without sinks,
    # a second split of one entry; three splits and fuse_combine=False stay unfused (the _m kernel's plain path).
    layout = kernel.split("_")[3]
    extra = 128 if layout == "v4" else 0
    blocks = h // 64
    if kernel not in mla.kernels:   # retired: in the tuning fatbin
        mla = request.getfixturevalue("mla_tuning")
    lossy = dict(lossy_bf16_dequant=True)   # V3.2's pairs round e4m3 x scale (exact on these power-of-two scales)
    plan = mla.make_plan(layout, 3, h, 512, extra, kernel=kernel, splits=2, **lossy)
    assert plan.fuse_combine and plan.counter_ints == 3 * 16 * blocks
    assert not mla.make_plan(layout, 3, h, 512, extra, kernel=kernel, splits=3, **lossy).fuse_combine
    assert not mla.make_plan(layout, 3, h, 512, extra, kernel=kernel[:-2], splits=2, fuse_combine=True,
                             **lossy).fuse_combine
    fused = dict(kernel=kernel, splits=2)
    for _ in range(2):
        run_and_check(mla, gen, layout, 3, 1, h, 512, topk_extra=extra, empty_rows=(1,), **fused)
    # a warp with rows past h (the pair: its second block partly empty)
    run_and_check(mla, gen, layout, 2, 1, h + 8 if blocks == 1 else h - 8, 512, topk_extra=extra, empty_rows=(0,),
                  **fused)
    run_and_check(mla, gen, layout, 2, 1, 128, 2048 if layout == "v32" else 1025, invalid_frac=0.95, **fused)
    run_and_check(mla, gen, layout, 2, 2, h, 512, topk_extra=extra, sinks=False, sm_scale=0.13523, **fused)
    run_and_check(mla, gen, layout, 2, 1, h, 65, **fused)   # the second split holds one entry
    for unfused in (dict(kernel=kernel, splits=3), dict(kernel=kernel, splits=2, fuse_combine=False)):
        run_and_check(mla, gen, layout, 3, 1, h, 512, topk_extra=extra, empty_rows=(1,), **unfused)


def test_default_merges_split_pairs_at_64_heads(mla, sm90):
    # V4's default, and V3.2's fastest (the lossy opt-in; its exact default, the wge kernel, has no pair variant)
    for layout, entries, lossy in (("v4", 640, False), ("v32", 2048, True)):
        plan = mla.make_plan(layout, 64, 64, entries, lossy_bf16_dequant=lossy)
        assert plan.splits == 2 and plan.fuse_combine and plan.kernel.endswith("_m")
    assert mla.make_plan("v32", 64, 64, 2048).kernel == "sparse_mla_wg_v32_s3_e"


@pytest.mark.parametrize("suffix", ["_h", "_c2"])
@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_wg_variant_kernels(mla, gen, sm90, layout, suffix):
    # _h (f16 tile) and _c2 (warpgroup 1 converts half of each tile): the bf16 kernel's cases, the inputs the
    # f16 range handling is for, and tile counts around the ring depth (1 to 5 tiles and many)
    name = f"sparse_mla_wg_{layout}_s3{suffix}"
    for topk in (1, 32, 33, 64, 65, 96, 97, 130, 161):
        run_and_check(mla, gen, layout, 2, 1, 64, topk, kernel=name)
    extra = 128 if layout == "v4" else 0
    run_and_check(mla, gen, layout, 3, 1, 64, 512, topk_extra=extra, empty_rows=(1,), kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 128, 2048 if layout == "v32" else 1025, invalid_frac=0.9, kernel=name,
                  splits=3)
    run_and_check(mla, gen, layout, 2, 1, 96, 33, topk_extra=extra // 4, kernel=name)
    run_and_check(mla, gen, layout, 2, 2, 64, 512, topk_extra=extra, sinks=False, sm_scale=0.13523, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 64, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, kernel=name)
    if layout == "v4":
        run_and_check(mla, gen, "v4", 2, 1, 64, 300, topk_extra=40, page=1, kernel=name)
    else:   # fp32 scales that are not powers of two: the conversion's fp32 path (all, every other entry)
        run_and_check(mla, gen, "v32", 2, 1, 64, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, kernel=name)
        run_and_check(mla, gen, "v32", 2, 1, 64, 300, scale_mode="mixed", kernel=name)


def test_wg_next_n_2_no_sinks_pages_scales(mla, gen, sm90):
    run_and_check(mla, gen, "v4", 2, 2, 64, 512, topk_extra=128, sinks=False, sm_scale=0.13523, variant="wg")
    run_and_check(mla, gen, "v32", 2, 2, 128, 2048, sinks=False, sm_scale=0.13523, variant="wg")
    run_and_check(mla, gen, "v4", 2, 1, 64, 300, topk_extra=40, page=1, variant="wg")
    run_and_check(mla, gen, "v4", 2, 1, 64, 300, topk_extra=40, page=2, variant="wg")
    # fp32 scales that are not powers of two (V3.2): the conversion's fp32 path
    run_and_check(mla, gen, "v32", 2, 1, 64, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, variant="wg")
    run_and_check(mla, gen, "v32", 2, 1, 64, 300, scale_mode="mixed", variant="wg")
    run_and_check(mla, gen, "v32", 2, 1, 64, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, variant="wg")


# ---- wgt kernels (sm_90a: the wg CTA with 64-entry tiles gathered through the producer's registers; experimental
# ones in the tuning fatbin only, kernels/tuning/build.sh, which also holds the production kernels) ----

@pytest.fixture(scope="module")
def mla_tuning(mla):
    return tuning_launcher()


WGT_KERNELS = [f"sparse_mla_wg_{lay}_{v}" for v in ("t64", "t64q", "t64p", "t64c") for lay in ("v4", "v32")]
WGT_PRODUCTION = ["sparse_mla_wg_v32_t64c"]   # one of them is a production kernel (the V3.2 default at 64 heads)
WGTX_KERNELS = ["sparse_mla_wg_v4_t64x", "sparse_mla_wg_v32_t64x"]   # production; clusters of 2 head blocks
# tuning build: the st.async exchange, and the bulk one with balanced consumers
WGTXB_KERNELS = [f"sparse_mla_wg_{lay}_{v}" for v in ("t64xs", "t64xb") for lay in ("v4", "v32")]


def test_wgt_kernels_are_experimental_and_in_the_tuning_fatbin_only(mla, mla_tuning):
    experimental = {n for n, k in mla_tuning.kernels.family("wg").items()
                    if k.shape.get("experimental") and not k.shape.get("probe")}
    assert experimental == set(WGT_KERNELS + WGTXB_KERNELS) - set(WGT_PRODUCTION)
    assert not experimental & set(mla.kernels.kernels)
    assert set(WGTX_KERNELS + WGT_PRODUCTION) <= set(mla.kernels.kernels)   # production ones


@pytest.mark.parametrize("name", WGT_KERNELS)
def test_wgt_kernels(mla_tuning, gen, sm90, name):
    # every wg case: tile counts around the two buffers and the register prefetch (1 to 4 tiles, and many),
    # NaN in every unselected entry, -1 and out-of-range indices, empty rows, splits through the combine (empty
    # splits included), sinks or not, next_n 2, pages 1 / 2, q far outside bf16's comfortable range, 16 heads
    # (a block mostly empty), 96 and 128 heads (two head blocks, the second partly empty)
    mla, layout = mla_tuning, name.split("_")[3]
    extra = 128 if layout == "v4" else 0
    long = 2048 if layout == "v32" else 512
    for topk in (1, 31, 33, 63, 64, 65, 127, 128, 129, 200, 257):
        run_and_check(mla, gen, layout, 2, 1, 64, topk, kernel=name)
    run_and_check(mla, gen, layout, 3, 1, 64, 512, topk_extra=extra, empty_rows=(1,), kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 96, 33, topk_extra=extra // 4, kernel=name)
    for h in (16, 64, 96, 128):
        run_and_check(mla, gen, layout, 2, 1, h, long, topk_extra=extra, empty_rows=(1,), kernel=name)
    for splits in (1, 3, 16):
        run_and_check(mla, gen, layout, 3, 1, 128, long, topk_extra=extra, empty_rows=(2,), splits=splits,
                      kernel=name)
        run_and_check(mla, gen, layout, 2, 1, 64, 2048 if layout == "v32" else 1025, invalid_frac=0.95,
                      splits=splits, kernel=name)
    run_and_check(mla, gen, layout, 2, 2, 64, 512, topk_extra=extra, sinks=False, sm_scale=0.13523, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 64, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 64, 300, topk_extra=extra // 4, page=1, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 64, 300, topk_extra=extra // 4, page=2, kernel=name)
    if layout == "v32":   # fp32 scales that are not powers of two: the conversion's fp32 path (all, every other entry)
        run_and_check(mla, gen, "v32", 2, 1, 64, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, kernel=name)
        run_and_check(mla, gen, "v32", 2, 1, 64, 300, scale_mode="mixed", kernel=name)


def test_default_takes_the_cluster_kernels_at_128_heads(mla, gen, sm90):
    # V4's default; V3.2's with the lossy opt-in (the pair rounds e4m3 x fp32 scale: its exact default is wge / ds)
    lossy = dict(lossy_bf16_dequant=True)
    assert mla.pick_kernel("v32", 128, rows=64, **lossy) == "sparse_mla_wg_v32_t64x"
    assert mla.pick_kernel("v32", 128, rows=64) == "sparse_mla_wg_v32_s3_e"
    assert mla.pick_kernel("v4", 128, rows=128) == "sparse_mla_wg_v4_t64x"
    assert mla.pick_kernel("v4", 96, rows=32) == "sparse_mla_wg_v4_t64x"
    assert mla.pick_kernel("v4", 128, rows=1) == "sparse_mla_wg_v4_t64x"    # every row count (NOTES.md)
    assert mla.pick_kernel("v32", 64, rows=64, **lossy) == "sparse_mla_wg_v32_t64c"   # one head block: no cluster
    # at one row: splits of one tile each, merged by the combine kernel
    run_and_check(mla, gen, "v32", 1, 1, 128, 2048, **lossy)
    run_and_check(mla, gen, "v4", 1, 1, 128, 512, topk_extra=128)


@pytest.mark.parametrize("name", WGTX_KERNELS + WGTXB_KERNELS)
def test_wgtx_cluster_kernels(request, mla, gen, sm90, name):
    # the wgt cases at the head counts a cluster of two 64-head blocks serves (96: the second block partly empty;
    # 256: two clusters per row)
    layout = name.split("_")[3]
    if name in WGTXB_KERNELS:
        mla = request.getfixturevalue("mla_tuning")
    extra = 128 if layout == "v4" else 0
    long = 2048 if layout == "v32" else 512
    for topk in (1, 31, 33, 63, 64, 65, 127, 128, 129, 200, 257):
        run_and_check(mla, gen, layout, 2, 1, 128, topk, kernel=name)
    for h in (96, 128, 256):
        run_and_check(mla, gen, layout, 2, 1, h, long, topk_extra=extra, empty_rows=(1,), kernel=name)
        run_and_check(mla, gen, layout, 2, 1, h, 33, topk_extra=extra // 4, kernel=name)
    with pytest.raises(ValueError, match="clusters of 2 head blocks"):
        mla.make_plan(layout, 8, 64, 512, kernel=name)
    for splits in (1, 3, 16):
        run_and_check(mla, gen, layout, 3, 1, 128, long, topk_extra=extra, empty_rows=(2,), splits=splits,
                      kernel=name)
        run_and_check(mla, gen, layout, 2, 1, 128, 2048 if layout == "v32" else 1025, invalid_frac=0.95,
                      splits=splits, kernel=name)
    run_and_check(mla, gen, layout, 2, 2, 128, 512, topk_extra=extra, sinks=False, sm_scale=0.13523, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 128, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 128, 300, topk_extra=extra // 4, page=1, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 128, 300, topk_extra=extra // 4, page=2, kernel=name)
    if layout == "v32":
        run_and_check(mla, gen, "v32", 2, 1, 128, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, kernel=name)
        run_and_check(mla, gen, "v32", 2, 1, 128, 300, scale_mode="mixed", kernel=name)
    else:   # UE8M0 exponents above the fast conversion's range: warps with such an entry convert through fp32
        run_and_check(mla, gen, "v4", 2, 1, 128, 512, topk_extra=extra, scale_factor=2.0 ** 20, q_scale=2.0 ** -20,
                      kernel=name)


# ---- wge kernels (sm_90a, V3.2: the wg pipeline exact for any fp32 tile scale) ----

WGE_KERNELS = ["sparse_mla_wg_v32_s3_e", "sparse_mla_wg_v32_s3_e_c2"]   # _e_c2 retired (tuning fatbin)
# SGLang's amax/448 scales: the wge kernels must be as accurate as the ds kernels (1.6-1.7e-3 relative L2, worst
# row-head <= 2.6e-3, lse within 1.1e-4; NOTES.md "Accuracy on SGLang's scales"; a lane-level CPU emulation of the
# wge kernel gave 1.6e-3, worst 2.0-2.5e-3). 3e-3 / 5e-3 is that bf16-output level with margin, and well below the
# wg kernels' 6.9-7.6e-3 (worst 5-10e-2, lse 0.11-0.14) on the same caches, so a scale applied by rounding fails.
AMAX448 = dict(scale_mode="amax448", max_rel=3e-3, max_worst=5e-3)


def test_wge_kernels_are_in_the_fatbin(mla, mla_tuning):
    assert {n for n, k in mla.kernels.family("wg").items() if k.shape.get("exact_scales")} == {WGE_KERNELS[0]}
    assert {n for n, k in mla_tuning.kernels.family("wg").items() if k.shape.get("exact_scales")} == set(WGE_KERNELS)


@pytest.mark.parametrize("name", WGE_KERNELS)
def test_wge_every_wg_case(mla, gen, sm90, name):
    # every case the wg kernels run (V3.2), with power-of-two scales (NaN in every unselected entry, -1 indices,
    # empty rows, splits through the combine, sinks or not), and tile counts around the ring depth
    for topk in (1, 32, 33, 64, 65, 96, 97, 130, 161, 333, 2047):
        run_and_check(mla, gen, "v32", 2, 1, 64, topk, kernel=name)
    for h in (64, 96, 128):
        run_and_check(mla, gen, "v32", 2, 1, h, 2048, empty_rows=(1,), kernel=name)
    for splits in (1, 3, 16):
        run_and_check(mla, gen, "v32", 3, 1, 128, 2048, empty_rows=(2,), splits=splits, kernel=name)
        run_and_check(mla, gen, "v32", 2, 1, 64, 2048, invalid_frac=0.95, splits=splits, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 96, 33, kernel=name)
    run_and_check(mla, gen, "v32", 2, 2, 128, 2048, sinks=False, sm_scale=0.13523, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 300, page=1, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 300, page=2, kernel=name)
    # q far outside f16's range (and tiny): the per-head power-of-two rescale keeps QK exact
    run_and_check(mla, gen, "v32", 2, 1, 64, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 1000, q_scale=2.0 ** 20, sm_scale=2.0 ** -26, kernel=name)


@pytest.mark.parametrize("name", WGE_KERNELS)
def test_wge_any_fp32_scale(mla, gen, sm90, name):
    # scales that are not powers of two, and scales far outside f16's range either way (P x scale is taken
    # relative to the running largest scale, so neither over- nor underflows)
    run_and_check(mla, gen, "v32", 2, 1, 64, 2048, empty_rows=(1,), scale_factor=1 + 2 ** -20, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 700, scale_factor=2.0 ** -40, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 700, scale_factor=2.0 ** -60, kernel=name)
    run_and_check(mla, gen, "v32", 2, 1, 64, 700, scale_factor=2.0 ** 40, sm_scale=2.0 ** -40, kernel=name)
    # SGLang's amax/448 scales at the bf16 level (AMAX448)
    for B, h, splits in ((2, 64, None), (8, 128, None), (2, 128, 3), (3, 96, 16)):
        run_and_check(mla, gen, "v32", B, 1, h, 2048, empty_rows=(1,), splits=splits, kernel=name, **AMAX448)
    run_and_check(mla, gen, "v32", 2, 2, 64, 2048, sinks=False, sm_scale=0.13523, invalid_frac=0.5, kernel=name,
                  **AMAX448)


def test_wge_variant_and_the_exact_default(mla, gen, sm90):
    run_and_check(mla, gen, "v32", 8, 1, 128, 2048, variant="wge", lossy_bf16_dequant=False, **AMAX448)
    run_and_check(mla, gen, "v32", 8, 1, 128, 2048, **AMAX448)   # the default: the same kernel
    assert mla.pick_kernel("v32", 128, variant="wge", rows=8) == WGE_KERNELS[0]
    assert mla.make_plan("v32", 8, 128, 2048).kernel == WGE_KERNELS[0]

# ---- bf16 KV (V4: 512-dim entry, K = V incl. RoPE; V3.2: 576-dim key, V = first 512) ----

@pytest.mark.parametrize("h", [8, 16, 32, 64, 128])
def test_bf16_v4_csa_window_plus_selected(mla, gen, h):
    # layout "v4" with a bf16 cache: the launcher dispatches to the bf16 kernels by dtype.
    run_and_check(mla, gen, "v4_bf16", 3, 1, h, 512, topk_extra=128, empty_rows=(1,), call_layout="v4")


@pytest.mark.parametrize("h", [16, 32, 64, 128])
def test_bf16_v32_top2048(mla, gen, h):
    run_and_check(mla, gen, "v32_bf16", 2, 1, h, 2048, empty_rows=(1,))


@pytest.mark.parametrize("layout,topk,extra", [("v4_bf16", 1, 0), ("v4_bf16", 31, 7), ("v4_bf16", 1025, 0),
                                               ("v32_bf16", 33, 0), ("v32_bf16", 2047, 0)])
def test_bf16_lengths_not_multiple_of_tile(mla, gen, layout, topk, extra):
    run_and_check(mla, gen, layout, 2, 1, 16, topk, topk_extra=extra)
    run_and_check(mla, gen, layout, 2, 1, 64, topk, topk_extra=extra)


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_bf16_split_kv_empty_rows_mostly_invalid(mla, gen, splits):
    run_and_check(mla, gen, "v4_bf16", 4, 1, 16, 512, topk_extra=128, empty_rows=(0, 2), splits=splits)
    run_and_check(mla, gen, "v32_bf16", 3, 1, 32, 2048, empty_rows=(2,), splits=splits, invalid_frac=0.9)


def test_bf16_next_n_2_no_sinks_and_small_smem(mla, gen):
    run_and_check(mla, gen, "v4_bf16", 2, 2, 64, 512, topk_extra=128, sinks=False, sm_scale=0.13523)
    run_and_check(mla, gen, "v32_bf16", 2, 2, 16, 2048, sinks=False, sm_scale=0.13523)
    run_and_check(mla, gen, "v4_bf16", 3, 1, 64, 512, topk_extra=128, empty_rows=(1,), small=True)
    run_and_check(mla, gen, "v32_bf16", 3, 1, 32, 2048, empty_rows=(1,), small=True)


def test_bf16_input_checks(mla, gen):
    from pdserve_kernels.sparse_mla_reference import make_inputs

    inp = make_inputs("v4_bf16", 2, 1, 16, 64, generator=gen)
    fp8 = make_inputs("v4", 2, 1, 16, 64, generator=gen)
    with pytest.raises(ValueError, match="must be bfloat16"):
        mla(inp["q"], fp8["kv"], inp["indices"], 0.1, layout="v4_bf16")
    with pytest.raises(ValueError, match="v32_bf16"):   # a 512-dim bf16 cache is not a V3.2 (576) cache
        mla(inp["q"], inp["kv"], inp["indices"], 0.1, layout="v32")
    with pytest.raises(ValueError, match="extra_kv must be bfloat16"):   # sources of one call share a dtype
        mla(inp["q"], inp["kv"], inp["indices"], 0.1, layout="v4", extra_kv=fp8["kv"],
            extra_indices=inp["indices"])


def test_the_production_fatbin_refuses_bf16_v4_and_names_the_tuning_build(mla, gen):
    # the bf16 V4 cases above ran from the tuning fatbin (run_and_check); the production launcher refuses them
    from pdserve_kernels.sparse_mla_decode import layout_refusal
    from pdserve_kernels.sparse_mla_reference import make_inputs

    if layout_refusal("v4_bf16", mla.kernels) is None:
        pytest.skip(f"{mla.path.name} has the bf16 V4 kernels: PDSERVE_SPARSE_MLA_FATBIN names a tuning build")
    inp = make_inputs("v4_bf16", 2, 1, 16, 64, generator=gen)
    with pytest.raises(ValueError, match=r"layout 'v4_bf16' has no kernel in .*bash kernels/tuning/build\.sh"):
        mla(inp["q"], inp["kv"], inp["indices"], 0.1, layout="v4")
    run_and_check(mla, gen, "v4_bf16", 2, 1, 16, 64, call_layout="v4")   # the same call, from the tuning fatbin


def test_input_checks_raise_clear_errors(mla, gen):
    from pdserve_kernels.sparse_mla_reference import make_inputs

    inp = make_inputs("v4", 2, 1, 16, 64, generator=gen)
    q, kv, ind = inp["q"], inp["kv"], inp["indices"]
    bad = [
        (dict(q=q.float()), "q must be bfloat16"),
        (dict(q=q[..., :256].contiguous()), "q must be"),
        (dict(indices=ind.long()), "indices must be int32"),
        (dict(kv=kv.cpu()), "kv is on cpu"),
        (dict(kv=kv[:, :48]), "power of two"),
    ]
    for override, msg in bad:
        args = {**dict(q=q, kv=kv, indices=ind), **override}
        with pytest.raises(ValueError, match=msg):
            mla(args["q"], args["kv"], args["indices"], 0.1, layout="v4")
    with pytest.raises(ValueError, match="layout"):
        mla(q, kv, ind, 0.1, layout="v5")


# ---- first-version kernels of the tuning build: 16 warps (_w16, warp pairs splitting d_qk in QK, measured no
# faster at one row) and the timeline twins (_tl, and the combines' _tl) that probe_first_timeline.py reads ----

W16_KERNELS = {"v4": "sparse_mla_v4_h16_t64_w16", "v32": "sparse_mla_v32_h16_t64_w16",
               "v4_bf16": "sparse_mla_v4b_h16_t64_w16", "v32_bf16": "sparse_mla_v32b_h16_t64_w16"}


@pytest.mark.parametrize("layout", sorted(W16_KERNELS))
def test_w16_kernels(mla_tuning, gen, layout):
    # One tile per split (the one-row shape they are for), several tiles per split (the ring and the partial-S
    # buffer reused), one split (no combine), lengths not multiples of the tile, heads past h inside the tile,
    # empty rows, mostly invalid entries, next_n 2 without sinks.
    v4 = layout.startswith("v4")
    kw = dict(kernel=W16_KERNELS[layout], call_layout="v4" if layout == "v4_bf16" else None)
    topk, extra = (512, 128) if v4 else (2048, 0)
    run_and_check(mla_tuning, gen, layout, 1, 1, 16, topk, topk_extra=extra, **kw)
    run_and_check(mla_tuning, gen, layout, 3, 1, 16, topk, topk_extra=extra, empty_rows=(1,), splits=3, **kw)
    run_and_check(mla_tuning, gen, layout, 2, 1, 16, topk, topk_extra=extra, splits=1, **kw)
    run_and_check(mla_tuning, gen, layout, 2, 1, 8, 333 if v4 else 1025, topk_extra=7 if v4 else 0, **kw)
    run_and_check(mla_tuning, gen, layout, 2, 1, 16, topk, topk_extra=extra, invalid_frac=0.9, **kw)
    run_and_check(mla_tuning, gen, layout, 2, 2, 16, topk, topk_extra=extra, sinks=False, sm_scale=0.13523, **kw)


@pytest.mark.parametrize("case", ["v4-csa", "v4-hca-bf16"])
def test_timeline_kernels_give_the_default_results(mla_tuning, gen, case):
    # probe_first_timeline.py's calls: the _tl main kernel and the _tl combine (stamps in the counters pointer)
    # write what the production kernels write, bit for bit.
    import sys

    sys.path.insert(0, str(REPO / "kernels" / "tuning"))
    sys.path.insert(0, str(REPO / "kernels" / "bench"))
    from harness import CASES, mla_batch, mla_pool

    layout = CASES[case][0]
    pools: dict = {}
    mla_pool(layout, layout, 1 << 16, pools, gen)
    (x,) = mla_batch(case, 1, [16], gen, pools)
    ref_o, ref_lse = x.call(mla_tuning)()
    name = "sparse_mla_v4_h16_t64_tl" if layout == "v4" else "sparse_mla_v4b_h16_t64_tl"
    topk_extra = x.win_ind.shape[-1] if x.win_ind is not None else 0
    plan = mla_tuning.make_plan(x.layout, 1, 16, x.ind.shape[-1], topk_extra, kernel=name)
    assert plan.splits > 1, plan
    stamps = torch.zeros(4096 + 4 * 16, dtype=torch.int64, device="cuda")
    ws = torch.empty(plan.splits * 16 * 513, dtype=torch.float32, device="cuda")
    out, lse = torch.empty_like(ref_o), torch.empty_like(ref_lse)
    launch = mla_tuning.module.launch
    mla_tuning.module.launch = lambda n, *a, **k: launch(n + "_tl" if n.startswith("sparse_mla_combine") else n, *a,
                                                         **k)
    try:
        mla_tuning.launch(plan, x.q, x.kv, x.ind, x.sm_scale, sinks=x.sinks, extra_kv=x.extra.get("extra_kv", x.kv),
                          e3=x.extra.get("extra_indices", x.ind), out=out, lse=lse, o_part_ptr=ws.data_ptr(),
                          lse_part_ptr=ws.data_ptr() + 4 * plan.splits * 16 * 512, counters_ptr=stamps.data_ptr())
    finally:
        mla_tuning.module.launch = launch
    torch.cuda.synchronize()
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_lse)
    main = stamps[:plan.splits * 16].view(plan.splits, 16)
    assert (main[:, 0] > 0).all() and (main[:, 11] >= main[:, 0]).all(), "every main CTA stamps its entry and exit"
    combine = stamps[4096:].view(16, 4)
    assert (combine[:, 0] > 0).all(), "every combine CTA stamps"
    assert (combine[:, 1] >= combine[:, 0]).all() and (combine[:, 2] >= combine[:, 1]).all()


# ---- es kernels (experimental, tuning fatbin: warps split the tile's entries for QK, one barrier per tile) ----

ES_KERNELS = ["sparse_mla_es_v4_h16_t64_s2", "sparse_mla_es_v32_h16_t64_s2"]


def test_es_kernels_are_experimental_and_in_the_tuning_fatbin_only(mla, mla_tuning):
    es = {n for n, k in mla_tuning.kernels.family("ds").items() if k.shape.get("qk_split") == "entries"}
    assert es == set(ES_KERNELS) and all(mla_tuning.kernels[n].shape.get("experimental") for n in es)
    assert not es & set(mla.kernels.kernels)


@pytest.mark.parametrize("name", ES_KERNELS)
def test_es_kernels(mla_tuning, gen, name):
    # the ds kernels' cases: half-used head blocks, lengths around the 64-entry tile and the two-stage ring,
    # splits through the combine and fused, mostly invalid rows, next_n 2, pages 1 / 2, q far outside bf16's
    # comfortable range, NaN in every unselected entry
    mla, layout = mla_tuning, name.split("_")[3]
    extra = 128 if layout == "v4" else 0
    long = 2048 if layout == "v32" else 512
    for topk in (1, 63, 64, 65, 129, 200):
        run_and_check(mla, gen, layout, 2, 1, 16, topk, kernel=name)
    run_and_check(mla, gen, layout, 3, 1, 8, long, topk_extra=extra, empty_rows=(1,), kernel=name)
    for splits in (1, 3, 16):
        run_and_check(mla, gen, layout, 3, 1, 16, long, topk_extra=extra, empty_rows=(2,), splits=splits, kernel=name)
        run_and_check(mla, gen, layout, 2, 1, 16, long, topk_extra=extra, invalid_frac=0.95, splits=splits,
                      kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 16, long, topk_extra=extra, kernel=name, fuse_combine=True)
    run_and_check(mla, gen, layout, 2, 2, 16, long, topk_extra=extra, sinks=False, sm_scale=0.13523, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 16, 1000, q_scale=2.0 ** -20, sm_scale=2.0 ** 14, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 16, 300, topk_extra=extra // 4, page=1, kernel=name)
    run_and_check(mla, gen, layout, 2, 1, 16, 300, topk_extra=extra // 4, page=2, kernel=name)
