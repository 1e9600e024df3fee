"""GPU tests of the DSA indexer kernel against the PyTorch reference (marker `gpu`).

Fresh random inputs every run. Checks, per row:
* logits: |ours - ref| <= 1e-3 * mag elementwise against an fp64 reference, where
  mag = k_scale * sum_h |w_h| * sum_d |q_hd k_d| is the size of the summed terms (FP8 inputs are exact;
  the error is the tensor cores' fp32 accumulation, and a score can cancel to far below its terms);
* top-k exactness on our own fp32 scores: every selected score >= every unselected one;
* top-k against the reference, tie rule: a position may be swapped only with one whose reference
  score lies within the measured score error (2x max |ours - ref|) of the reference k-th score;
* rows with len <= k return 0..len-1 then -1; outputs are poisoned first, so every slot must be written;
* keys and scales beyond each length, spare blocks and unused block-table targets hold NaN: no NaN may
  reach a score or change a selection.
* the workspace (histograms and counters) is all zero again after every call.
Every kernel test runs on four paths (`path` fixture): "split" (scoring grid + selection grid, base kernels),
"early" (the split path with its small-batch kernels, early=True), "cluster" (early, the selection as one
thread-block cluster per row, cluster=True) and "fused" (one cooperative launch, selection at the tail of scoring).
"""

import math
import os
import pathlib
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU kernel tests need it")

pytestmark = pytest.mark.gpu

REPO = pathlib.Path(__file__).resolve().parents[2]
POISON = -7


@pytest.fixture(scope="module")
def indexer(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    from pdserve_kernels.dsa_indexer import DsaIndexer

    fatbin = os.environ.get("PDSERVE_KERNELS_FATBIN")
    if not fatbin:
        built = REPO / "kernels" / "build" / "dsa_indexer.fatbin"
        if built.is_file():
            fatbin = str(built)
        else:
            nvcc = shutil.which("nvcc")
            if nvcc is None:
                pytest.skip("no built fatbin and no nvcc to build one")
            out = tmp_path_factory.mktemp("fatbin")
            subprocess.run(["bash", str(REPO / "kernels" / "build.sh"), str(out)], check=True, timeout=600)
            fatbin = str(out / "dsa_indexer.fatbin")
    return DsaIndexer(fatbin=fatbin)


@pytest.fixture(params=["split", "early", "cluster", "fused"])
def path(request, indexer):
    if request.param == "cluster" and not indexer.cluster_ok:
        pytest.skip("the cluster select needs an sm_90 GPU")
    return request.param


def path_kwargs(path):
    """The launcher's arguments for a `path` fixture value ("early" / "cluster": the split path's variants)."""
    if path in ("early", "cluster"):
        return dict(path="split", early=True, cluster=path == "cluster")
    return dict(path=path, early=False if path else None)


def assert_workspace_zero(ind, rows):
    state = ind._state(rows)
    assert int(state.count_nonzero()) == 0, "the call left histogram or counter words non-zero"


def impls(ind):
    return ["wgmma", "mma"] if ind.capability == (9, 0) else ["mma"]


def run_and_check(ind, B, next_n, lens, topk, impl, *, explicit=False, max_blocks=None, chunk_pages=None,
                  zero_weights=False, path=None):
    from pdserve_kernels.reference import make_inputs, reference_scores

    inp = make_inputs(B, next_n, lens, max_blocks=max_blocks, explicit_lens=explicit)
    if zero_weights:
        inp["weights"].zero_()
    rows = B * next_n
    max_len = max(lens)
    stride = max(1, math.ceil(max_len / 4096)) * 4096
    out = torch.full((rows, topk), POISON, dtype=torch.int32, device="cuda")
    scores = torch.full((rows, stride), float("nan"), dtype=torch.float32, device="cuda")
    kw = path_kwargs(path)
    ind(**inp, topk=topk, out=out, scores=scores, impl=impl, max_len=max_len, chunk_pages=chunk_pages, **kw)
    torch.cuda.synchronize()
    if path is not None:
        assert ind.last_path[0] == kw["path"] and ind.last_plan.early == (path in ("early", "cluster"))
        assert ind.last_plan.cluster == (path == "cluster")
    assert_workspace_zero(ind, rows)
    refs, mags = reference_scores(inp["q"], inp["weights"], inp["kv_cache"], inp["context_lens"],
                                  inp["block_table"], with_magnitude=True)
    assert not (out == POISON).any(), "some output slots were never written"
    for r, ref in enumerate(refs):
        L = ref.numel()
        sel = out[r].long()
        if L <= topk:
            want = torch.cat([torch.arange(L, device="cuda"), torch.full((topk - L,), -1, device="cuda")])
            assert torch.equal(sel, want), f"row {r} (len {L} <= k {topk}): expected 0..{L - 1} then -1"
            if L == 0:
                continue
        got = scores[r, :L].double()
        assert torch.isfinite(got).all(), f"row {r}: non-finite score (NaN leaked from outside the length?)"
        diff = (got - ref).abs()
        err = diff.max().item()
        worst = (diff / (mags[r] + 1e-30)).max().item()
        assert bool((diff <= 1e-3 * mags[r] + 1e-12).all()), (
            f"row {r} len {L}: |ours-ref| reaches {worst:.3g} x the terms' magnitude (limit 1e-3)")
        if L <= topk:
            continue
        assert bool(((sel >= 0) & (sel < L)).all()), f"row {r}: index outside [0, {L})"
        assert torch.unique(sel).numel() == topk, f"row {r}: duplicate indices"
        mask = torch.zeros(L, dtype=torch.bool, device="cuda")
        mask[sel] = True
        assert got[mask].min() >= got[~mask].max(), f"row {r}: not the exact top-{topk} of its own scores"
        kth = torch.topk(ref, topk).values[-1]
        tol = 2 * err + 1e-12
        assert ref[mask].min() >= kth - tol, f"row {r}: selected a score below the k-th beyond tolerance"
        assert ref[~mask].max() <= kth + tol, f"row {r}: missed a score above the k-th beyond tolerance"
    return out


LEN_512 = [1, 511, 512, 513, 63, 64, 65, 127, 128, 129, 4097, 20000]
LEN_2048 = [1, 2047, 2048, 2049, 6000, 8191, 70001]


@pytest.mark.parametrize("topk,lens", [(512, LEN_512), (2048, LEN_2048)])
def test_mixed_lengths_next_n1(indexer, topk, lens, path):
    for impl in impls(indexer):
        run_and_check(indexer, len(lens), 1, lens, topk, impl, path=path)


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("topk", [512, 2048])
def test_next_n2_causal_rule(indexer, explicit, topk, path):
    lens = [1, 2, 513, 2049, 4096, 33333]
    for impl in impls(indexer):
        run_and_check(indexer, len(lens), 2, lens, topk, impl, explicit=explicit, path=path)


@pytest.mark.parametrize("topk", [512, 2048])
def test_single_long_row_split_across_ctas(indexer, topk, path):
    if path == "cluster":   # one cluster holds rows up to 128K: refused beyond, checked at the largest length
        from pdserve_kernels.reference import make_inputs

        with pytest.raises(ValueError, match="the cluster select covers rows"):
            indexer(**make_inputs(1, 1, [200_003]), topk=topk, **path_kwargs(path))
        for impl in impls(indexer):
            run_and_check(indexer, 1, 1, [131072 - 5], topk, impl, path=path)
        return
    for impl in impls(indexer):
        run_and_check(indexer, 1, 1, [200_003], topk, impl, path=path)


# 200: the early kernels prefetch the block ids of a chunk's first 128 pages; the rest come from global memory.
@pytest.mark.parametrize("chunk_pages", [1, 3, 64, 200])
def test_chunk_sizes_and_wide_block_table(indexer, chunk_pages, path):
    # max_blocks far beyond the lengths (max_context 1M): unused entries point at a NaN block.
    lens = [65, 5000, 12345, 64 * 40]
    impl = impls(indexer)[0]
    if path == "fused" and indexer.fused_chunk_pages(len(lens), max(lens), 1, impl, chunk_pages, grow=False) is None:
        # This chunk size gives more CTAs than fit on the GPU at once: the fused path must refuse it.
        from pdserve_kernels.reference import make_inputs

        with pytest.raises(ValueError, match="path='fused' needs the whole grid resident"):
            indexer(**make_inputs(len(lens), 1, lens), topk=2048, impl=impl, chunk_pages=chunk_pages, path=path)
        return
    run_and_check(indexer, len(lens), 1, lens, 2048, impl, max_blocks=(1 << 20) // 64,
                  chunk_pages=chunk_pages, path=path)


def test_all_scores_equal_takes_any_k(indexer, path):
    # weights 0: every score is 0, the whole row ties at the threshold (exact-tie path; 9000 tied
    # candidates exceed the shared-memory resolve's capacity, so the global fallback runs too).
    run_and_check(indexer, 2, 1, [3000, 9000], 512, impls(indexer)[0], zero_weights=True, path=path)


def test_workspace_is_clean_between_calls(indexer, path):
    for _ in range(3):
        run_and_check(indexer, 3, 1, [5000, 100, 30000], 2048, impls(indexer)[0], path=path)


@pytest.mark.parametrize("paths", [("fused", "split", "early", "fused", "early", "early", "split"),
                                   ("fused", "cluster", "split", "cluster", "early", "cluster", "cluster", "split")],
                         ids=["base_paths", "with_cluster"])
def test_paths_alternate_on_one_workspace(indexer, paths):
    # Each path leaves the shared histograms and counters zeroed for the other.
    for path in paths:
        run_and_check(indexer, 2, 2, [40000, 3000], 2048, impls(indexer)[0], path=path)


def test_default_path_choice(indexer):
    from pdserve_kernels.reference import make_inputs

    impl = impls(indexer)[0]
    # The fused path is opt-in (it measured slower on H200, kernels/NOTES.md): the default is "split",
    # even where the fused grid would fit.
    assert indexer.fused_chunk_pages(1, 131072, 1, impl, grow=False) is not None
    from pdserve_kernels.dsa_indexer import DEFAULT_EARLY

    indexer(**make_inputs(1, 1, [20000]), topk=2048)
    assert indexer.last_path[0] == "split" and indexer.last_plan.early == DEFAULT_EARLY
    # the cluster select where it measured faster (rows x max_len <= 2^20, sm_90), the early one beyond
    assert indexer.last_plan.cluster == indexer.cluster_ok
    indexer(**make_inputs(9, 1, [120000] * 9), topk=2048)   # every row within one cluster, 1.08 M positions in all
    assert not indexer.last_plan.cluster and indexer.last_plan.early == DEFAULT_EARLY
    with pytest.raises(ValueError, match="the fused path has none"):
        indexer(**make_inputs(1, 1, [100]), topk=2048, path="fused", early=True)
    # A large batch of long rows never fits on the GPU at once, even with the largest fused chunk.
    assert indexer.fused_chunk_pages(128, 131072, 1, impl, grow=False) is None
    assert indexer.fused_chunk_pages(128, 131072, 1, impl, grow=True) is None
    with pytest.raises(ValueError, match="path must be"):
        indexer(**make_inputs(1, 1, [100]), topk=2048, path="bogus")


def test_input_checks_raise_clear_errors(indexer):
    from pdserve_kernels.reference import make_inputs

    inp = make_inputs(2, 1, [100, 200])
    bad = [
        (dict(q=inp["q"].float()), "q must be float8_e4m3fn"),
        (dict(q=inp["q"][:, :, :32].contiguous()), "q must have shape"),
        (dict(weights=inp["weights"].double()), "weights must be float32"),
        (dict(context_lens=inp["context_lens"].long()), "context_lens must be int32"),
        (dict(block_table=inp["block_table"].t()), "block_table"),
        (dict(kv_cache=inp["kv_cache"].cpu()), "kv_cache is on cpu"),
        (dict(weights=inp["weights"].t().contiguous().t()), "weights must be contiguous"),
    ]
    for override, msg in bad:
        args = dict(inp, **override)
        with pytest.raises(ValueError, match=msg):
            indexer(**args, topk=512)


def own_topk_ok(scores, out, lens, topk):
    """Per row longer than topk: `out` holds topk distinct positions below the length, and every selected
    score >= every unselected one (a top-k of the kernel's own scores; ties at the k-th value in any order)."""
    for r, L in enumerate(lens):
        if L <= topk:
            continue
        sel = out[r].long()
        if not (bool(((sel >= 0) & (sel < L)).all()) and torch.unique(sel).numel() == topk):
            return False
        mask = torch.zeros(L, dtype=torch.bool, device="cuda")
        mask[sel] = True
        if not bool(scores[r, :L][mask].min() >= scores[r, :L][~mask].max()):
            return False
    return True


# The small-batch variants against the base kernels on the same inputs: B in 1/8/64, up to 128K, lengths not
# multiples of 64 (and differing per row). At B=64 L=32K the early select CTAs cover 2 sub-chunks (tied scores
# from the ring), at B=64 L=128K 6 (more than the ring: re-read from L2); the cluster select, 1-2 per CTA.
@pytest.mark.parametrize("variant", ["early", "cluster"])
@pytest.mark.parametrize("B,L", [(1, 131072 - 3), (8, 32768 + 29), (64, 32768 - 1), (64, 131072 - 63)])
def test_small_batch_variant_equals_base_across_batches(indexer, B, L, variant):
    from pdserve_kernels.reference import make_inputs

    lens = [L - (37 * b) % 1000 for b in range(B)]
    inp = make_inputs(B, 1, lens)
    results = {}
    for v in ("split", variant):
        out, scores = indexer(**inp, topk=2048, max_len=max(lens), return_scores=True, **path_kwargs(v))
        torch.cuda.synchronize()
        assert indexer.last_plan.cluster == (v == "cluster")
        assert_workspace_zero(indexer, B)
        assert own_topk_ok(scores, out, lens, 2048), f"{v}: not an exact top-k of its own scores"
        results[v] = (out, scores)
    (out0, sc0), (out1, sc1) = results["split"], results[variant]
    for r, L_r in enumerate(lens):   # the same fp32 scores bit for bit, so the same sets up to exact ties
        assert torch.equal(sc0[r, :L_r], sc1[r, :L_r]), f"row {r}: {variant} computed other scores"
        kth = torch.topk(sc0[r, :L_r], 2048).values[-1]
        above0 = torch.sort(out0[r][sc0[r, out0[r].long()] > kth]).values
        above1 = torch.sort(out1[r][sc1[r, out1[r].long()] > kth]).values
        assert torch.equal(above0, above1), f"row {r}: {variant}'s set differs above the k-th score"


# The early scoring pipeline past its 6 page buffers (kStages): its first 6 pages are requested up front, later
# ones refill a slot one iteration after it was read, and each iteration waits for exactly its own page's group.
# A wait one group short reads a page before it lands, which shows only under load (call 8 on H200: B=64 wrong,
# B<=8 right), so: 64 rows, chunks from one page under the ring to well past it, scores bit for bit vs the base.
@pytest.mark.parametrize("chunk_pages", [5, 6, 7, 8, 13, 32])
def test_early_scoring_past_its_ring_equals_base(indexer, chunk_pages):
    from pdserve_kernels.reference import make_inputs

    lens = [8192 - (53 * b) % 700 for b in range(64)]
    inp = make_inputs(len(lens), 1, lens)
    for impl in impls(indexer):
        scores = {}
        for early in (False, True):
            _, scores[early] = indexer(**inp, topk=2048, impl=impl, chunk_pages=chunk_pages, path="split",
                                       early=early, return_scores=True)
            torch.cuda.synchronize()
            assert indexer.last_plan.early == early and indexer.last_plan.chunk_pages == chunk_pages
        for r, L_r in enumerate(lens):
            assert torch.equal(scores[False][r, :L_r], scores[True][r, :L_r]), (
                f"{impl} chunk {chunk_pages} row {r}: the early kernel computed other scores")


@pytest.mark.parametrize("variant", ["early", "cluster"])
def test_small_batch_variants_without_pdl(indexer, variant):
    # Without programmatic dependent launch the select grid starts after the scoring grid: the same result.
    from pdserve_kernels.reference import make_inputs

    lens = [70001, 2049, 100, 33333]
    inp = make_inputs(len(lens), 1, lens)
    out, scores = indexer(**inp, topk=2048, return_scores=True, pdl=False, **path_kwargs(variant))
    torch.cuda.synchronize()
    assert indexer.last_plan.early and indexer.last_plan.cluster == (variant == "cluster")
    assert_workspace_zero(indexer, len(lens))
    assert own_topk_ok(scores, out, lens, 2048)
    assert torch.equal(out[2, :100].long(), torch.arange(100, device="cuda")) and bool((out[2, 100:] == -1).all())


# The tuning build (kernels/tuning/build.sh) stamps each CTA's phases into `dsa_timeline` for
# kernels/tuning/probe_indexer_timeline.py. It must compute what the production build computes, and its stamps must
# mean what the probe reads: every CTA with work stamped, each CTA's phases in order.
SCORE_SLOTS, SELECT_SLOTS, SCORE_CTAS = 8, 16, 4096   # tl_word's layout (dsa_indexer/common.cuh)


def test_timeline_build_gives_the_production_results(indexer):
    from pdserve_kernels.dsa_indexer import DsaIndexer
    from pdserve_kernels.reference import make_inputs

    if not indexer.cluster_ok:
        pytest.skip("the timeline is read on the sm_90 small-batch path (cluster select)")
    built = REPO / "kernels" / "build" / "dsa_indexer_tuning.fatbin"
    if not built.is_file():
        if shutil.which("nvcc") is None:
            pytest.skip("no tuning fatbin (kernels/tuning/build.sh) and no nvcc to build one")
        subprocess.run(["bash", str(REPO / "kernels" / "tuning" / "build.sh")], check=True, timeout=900)
    probe = DsaIndexer(fatbin=str(built))
    lens = [131072 - 3]
    inp = make_inputs(1, 1, lens)
    out0, sc0 = indexer(**inp, topk=2048, return_scores=True)
    probe.module.zero_global("dsa_timeline")
    out1, sc1 = probe(**inp, topk=2048, return_scores=True)
    torch.cuda.synchronize()
    assert probe.last_plan.cluster and probe.last_plan.early
    assert torch.equal(sc0[0, :lens[0]], sc1[0, :lens[0]])
    kth = torch.topk(sc0[0, :lens[0]], 2048).values[-1]
    for out, sc in ((out0, sc0), (out1, sc1)):
        assert own_topk_ok(sc, out, lens, 2048)
    above = [torch.sort(o[0][s[0, o[0].long()] > kth]).values for o, s in ((out0, sc0), (out1, sc1))]
    assert torch.equal(*above)

    raw = probe.module.read_global("dsa_timeline")
    words = torch.frombuffer(bytearray(raw), dtype=torch.int64)
    score = words[:SCORE_CTAS * SCORE_SLOTS].view(SCORE_CTAS, SCORE_SLOTS)
    select = words[SCORE_CTAS * SCORE_SLOTS:].view(-1, SELECT_SLOTS)
    plan = probe.last_plan
    pages = -(-lens[0] // 64)
    working = -(-pages // plan.chunk_pages)
    assert bool((score[:working, [0, 1, 2, 3, 4, 6, 5]].diff(dim=1) >= 0).all()), "a scoring CTA's phases out of order"
    assert bool((score[:working, 0] > 0).all()) and bool((score[working:, 5] == 0).all()), "CTAs with pages flush"
    ctas = select[:, 0].gt(0).sum().item()
    assert ctas == plan.select_grid[0], "every select CTA stamps its entry"
    assert bool((select[:ctas, :6].diff(dim=1) >= 0).all()), "a select CTA's phases out of order"
    rank0 = select[0]
    assert bool((rank0[[5, 6, 7, 9, 10, 8]].diff() >= 0).all()), "the resolve's phases out of order"
    assert 0 < rank0[15].item() <= lens[0], "the resolve's tied candidates"
