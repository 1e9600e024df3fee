"""CPU checks of the serving API (pdserve_kernels.ops): the torch.library ops are registered with the expected
schemas (mutated workspaces declared), their fake implementations give the outputs' shapes and dtypes under
FakeTensorMode and make_fx tracing (no GPU, no kernel runs), and the plans' arithmetic agrees with the built
kernels' metadata (built from the headers: conftest's metadata_dir). The ops themselves run in
test_ops_gpu.py."""

import importlib
import itertools

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the ops need it")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

ops = importlib.import_module("pdserve_kernels.ops")
dsa_mod = importlib.import_module("pdserve_kernels.dsa_indexer")
mla_mod = importlib.import_module("pdserve_kernels.sparse_mla_decode")


DSA_SCHEMA = ("pdserve::dsa_indexer_topk(Tensor q, Tensor weights, Tensor kv_cache, Tensor context_lens, "
              "Tensor block_table, Tensor(a!) state, Tensor(b!) scratch, SymInt topk, SymInt max_len, "
              "SymInt chunk_pages, SymInt select_subs, bool early=False, bool cluster=False) -> Tensor")
MLA_SCHEMA = ("pdserve::sparse_mla_decode(Tensor q, Tensor kv, Tensor indices, Tensor? sinks, Tensor? extra_kv, "
              "Tensor? extra_indices, Tensor(a!) workspace, float sm_scale, str layout, str kernel, SymInt splits, "
              "SymInt per_split) -> (Tensor, Tensor)")


def test_ops_are_registered_with_their_schemas():
    assert str(torch.ops.pdserve.dsa_indexer_topk.default._schema) == DSA_SCHEMA
    assert str(torch.ops.pdserve.sparse_mla_decode.default._schema) == MLA_SCHEMA
    # the workspaces are the only mutated arguments, and no output aliases an input
    for op, mutated in ((torch.ops.pdserve.dsa_indexer_topk, {"state", "scratch"}),
                        (torch.ops.pdserve.sparse_mla_decode, {"workspace"})):
        schema = op.default._schema
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == mutated
        assert all(r.alias_info is None for r in schema.returns)


def _dsa_args(B, next_n, topk, max_len=5000, kv_dtype=torch.uint8, lens_2d=False):
    plan = dsa_mod.plan_dsa(B, next_n, topk, max_len, 132)
    return (torch.empty(B, next_n, 64, 128, dtype=torch.float8_e4m3fn, device="cuda"),
            torch.empty(B * next_n, 64, device="cuda"),
            torch.empty(50, 64, 1, 132, dtype=kv_dtype, device="cuda"),
            torch.empty((B, next_n) if lens_2d else (B,), dtype=torch.int32, device="cuda"),
            torch.empty(B, 100, dtype=torch.int32, device="cuda"),
            torch.empty(plan.state_ints, dtype=torch.int32, device="cuda"),
            torch.empty(plan.scratch_ints, dtype=torch.int32, device="cuda"),
            topk, plan.max_len, plan.chunk_pages, plan.select_subs)


@pytest.mark.parametrize("B,next_n,topk,lens_2d", [(1, 1, 2048, False), (5, 2, 512, True), (64, 1, 2048, True)])
def test_indexer_fake_gives_shape_and_dtype(B, next_n, topk, lens_2d):
    with FakeTensorMode():
        out = torch.ops.pdserve.dsa_indexer_topk(*_dsa_args(B, next_n, topk, lens_2d=lens_2d))
        assert tuple(out.shape) == (B * next_n, topk)
        assert out.dtype == torch.int32 and out.device.type == "cuda"


def _mla_args(layout, B, h, topk, q_rank=4, extra=0, splits=1):
    lay = mla_mod.LAYOUTS[layout]
    q = torch.empty(*((B, 1) if q_rank == 4 else (B,)), h, lay.dqk, dtype=torch.bfloat16, device="cuda")
    if lay.bf16:   # SGLang's bf16 pool: [slots, 1, 576]
        kv = torch.empty(4096, 1, lay.dqk, dtype=torch.bfloat16, device="cuda")
    else:          # SGLang's fp8 pool viewed [pages, 64, 1, 656] as float8_e4m3fn
        kv = torch.empty(64, 64, 1, lay.entry_bytes, dtype=torch.float8_e4m3fn, device="cuda")
    ind = torch.empty(B, 1, topk, dtype=torch.int32, device="cuda")
    e_kv = kv if extra else None
    e_ind = torch.empty(B, 1, extra, dtype=torch.int32, device="cuda") if extra else None
    ws = torch.empty(max(1, B * splits * h * 513), dtype=torch.float32, device="cuda")
    return (q, kv, ind, torch.empty(h, device="cuda"), e_kv, e_ind, ws, 0.1352, layout, "any_kernel", splits, 512)


@pytest.mark.parametrize("layout,B,h,topk,q_rank,extra", [
    ("v32", 4, 128, 2048, 4, 0), ("v32_bf16", 3, 16, 2048, 3, 0), ("v4", 2, 64, 512, 4, 128),
    ("v4_bf16", 1, 8, 64, 3, 0)])
def test_mla_fake_gives_shapes_and_dtypes(layout, B, h, topk, q_rank, extra):
    with FakeTensorMode():
        out, lse = torch.ops.pdserve.sparse_mla_decode(*_mla_args(layout, B, h, topk, q_rank, extra))
        lead = (B, 1) if q_rank == 4 else (B,)
        assert tuple(out.shape) == (*lead, h, 512) and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        assert tuple(lse.shape) == (*lead, h) and lse.dtype == torch.float32


def test_both_ops_trace_with_fake_tensors():
    """make_fx over fake CUDA tensors (what torch.compile's tracing does): the graph holds both ops, and the
    traced outputs have the fake implementations' metadata."""
    with FakeTensorMode():   # fake CUDA tensors: no GPU is touched
        dsa = _dsa_args(2, 1, 2048)
        mla = _mla_args("v32", 2, 64, 2048)

    def layer(q, w, kv, ctx, bt, st, sc, mq, mkv, mws):
        idx = torch.ops.pdserve.dsa_indexer_topk(q, w, kv, ctx, bt, st, sc, *dsa[7:])
        o, lse = torch.ops.pdserve.sparse_mla_decode(mq, mkv, idx.view(2, 1, 2048), None, None, None, mws, *mla[7:])
        return o * 2, lse

    gm = make_fx(layer, tracing_mode="fake")(*dsa[:7], mla[0], mla[1], mla[6])
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "pdserve.dsa_indexer_topk.default" in targets and "pdserve.sparse_mla_decode.default" in targets
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert tuple(outs[0].meta["val"].shape) == (2, 1, 64, 512) and outs[1].meta["val"].dtype == torch.float32


# ---- the plans' arithmetic ----

@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("B,next_n,max_len,sms", [(1, 1, 131072, 132), (64, 1, 32768, 132), (8, 2, 5000, 78),
                                                  (128, 1, 163840, 132), (3, 1, 1, 132)])
def test_dsa_plan_arithmetic(B, next_n, max_len, sms, early):
    p = dsa_mod.plan_dsa(B, next_n, 2048, max_len, sms, early=early)
    pages = -(-max_len // 64)
    assert p.rows == B * next_n and p.max_len == max_len and p.early == early
    assert p.len_stride % 4096 == 0 and p.len_stride - 4096 < max_len <= p.len_stride
    ctas_per_sm = 3 if early and next_n == 1 else 2   # the chunk policies: one wave (early), about 2 CTAs per SM
    assert p.chunk_pages == max(2, min(32, -(-B * pages // (ctas_per_sm * sms))))
    assert p.n_chunks * p.chunk_pages >= pages > (p.n_chunks - 1) * p.chunk_pages   # the grid covers every page once
    assert p.select_grid[0] * p.select_subs >= p.runs == p.len_stride // 4096
    assert p.select_grid[1] == p.rows and p.score_grid == (p.n_chunks, B, 1)
    assert p.state_ints == p.rows * (4096 + 8) and p.scratch_ints == p.rows * p.len_stride * 3


def test_dsa_early_plan_changes_only_small_batches():
    # B=1 L=128K on 132 SMs: 6 pages per CTA (all in flight in the early pipeline), 342 CTAs, one wave of <= 3/SM
    p = dsa_mod.plan_dsa(1, 1, 2048, 131072, 132, early=True)
    assert (p.chunk_pages, p.n_chunks) == (6, 342) and p.n_chunks <= 3 * 132
    assert (p.score_kernel("wgmma"), p.select_kernel) == ("dsa_score_early_wgmma_n1", "dsa_select_early")
    base = dsa_mod.plan_dsa(1, 1, 2048, 131072, 132, early=False)
    assert (base.chunk_pages, base.score_kernel("mma"), base.select_kernel) == (8, "dsa_score_mma_n1", "dsa_select")
    # large batches keep the base chunk (32 pages): only the kernels differ there
    for B, L in ((64, 131072), (64, 32768), (128, 131072), (8, 131072)):
        e, b = (dsa_mod.plan_dsa(B, 1, 2048, L, 132, early=x) for x in (True, False))
        assert e.chunk_pages == b.chunk_pages == 32 and e.select_subs == b.select_subs
    # an explicit chunk wins over either policy; the default variant is DEFAULT_EARLY
    assert dsa_mod.plan_dsa(1, 2, 2048, 131072, 132, early=True, chunk_pages=8).chunk_pages == 8
    assert dsa_mod.plan_dsa(1, 1, 2048, 131072, 132).early == dsa_mod.DEFAULT_EARLY
    assert dsa_mod.plan_dsa(1, 2, 2048, 9000, 132, early=True).score_kernel("wgmma") == "dsa_score_early_wgmma_n2"


@pytest.mark.parametrize("L,subs,ctas", [(131072, 2, 16), (131072 - 4095, 2, 16), (100000, 2, 13), (32768, 1, 8),
                                         (8192 + 1, 1, 3), (1, 1, 1)])
def test_dsa_cluster_plan(L, subs, ctas):
    # one cluster per row: the fewest 4096-score sub-chunks per CTA that keep the row within 16 CTAs
    p = dsa_mod.plan_dsa(4, 1, 2048, L, 132, cluster=True)
    assert p.early and p.cluster and p.select_kernel == "dsa_select_cluster"
    assert (p.select_subs, p.select_grid, p.select_cluster) == (subs, (ctas, 4, 1), ctas)
    assert p.select_cluster * p.select_subs * 4096 >= L   # the cluster covers the row
    assert p.chunk_pages == dsa_mod.early_chunk_pages(4, L, 132, 1)


def test_dsa_cluster_plan_refuses():
    with pytest.raises(ValueError, match="the cluster select covers rows of up to 131072"):
        dsa_mod.plan_dsa(1, 1, 2048, 131073, 132, cluster=True)
    with pytest.raises(ValueError, match="more than one cluster of 16"):
        dsa_mod.plan_dsa(1, 1, 2048, 131072, 132, cluster=True, select_subs=1)
    with pytest.raises(ValueError, match="True with cluster=True"):
        dsa_mod.plan_dsa(1, 1, 2048, 8192, 132, cluster=True, early=False)
    with pytest.raises(ValueError, match="cluster must be a bool or None"):
        dsa_mod.plan_dsa(1, 1, 2048, 8192, 132, cluster=1)
    assert dsa_mod.plan_dsa(1, 1, 2048, 8192, 132).select_cluster is None   # no cluster launch otherwise


@pytest.mark.parametrize("B,next_n,L,capable,kw,want", [
    (1, 1, 131072, True, {}, True),                       # B=1 L=128K: the target row
    (8, 1, 131072, True, {}, True),                       # 2^20 positions: the bound itself
    (64, 1, 8192, True, {}, True),
    (5, 2, 131072, True, {}, False),                      # next_n 2: 10 rows x 128K, over the bound
    (64, 1, 32768, True, {}, False),                      # measured slower there
    (1, 1, 131073, True, {}, False),                      # longer than one cluster covers
    (1, 1, 500000, True, {"max_blocks": 2048}, True),     # the block table clamps the bound to 128K
    (1, 1, 8192, False, {}, False),                       # not an sm_90 GPU
    (1, 1, 8192, True, {"early": False}, False),          # the base kernels asked for
    (1, 1, 8192, True, {"select_subs": 1}, False),        # an explicit select split is the early select's
    (1, 1, 8192, True, {"cluster": False}, False),
    (64, 1, 32768, True, {"cluster": True}, True),        # explicit wins over the rule
])
def test_dsa_cluster_by_default_where_measured_faster(B, next_n, L, capable, kw, want):
    p = dsa_mod.plan_dsa(B, next_n, 2048, L, 132, cluster_capable=capable, **kw)
    assert p.cluster == want and p.early == (want or kw.get("early", dsa_mod.DEFAULT_EARLY))
    assert p.select_kernel == ("dsa_select_cluster" if want else "dsa_select_early" if p.early else "dsa_select")
    assert dsa_mod.plan_dsa(B, next_n, 2048, L, 132, **kw).cluster == kw.get("cluster", False)   # pure default: off


def test_dsa_early_kernels_in_metadata_fit_three_per_sm(metadata_dir):
    table = dsa_mod.load_kernel_table(metadata_dir / "dsa_indexer.fatbin")
    for early in (False, True):
        for next_n, impl in itertools.product((1, 2), ("wgmma", "mma")):
            p = dsa_mod.plan_dsa(1, next_n, 2048, 131072, 132, early=early)
            k = table[p.score_kernel(impl)]
            assert k.family == "score" and k.shape["early"] == early and k.shape["next_n"] == next_n
        assert table[p.select_kernel].family == "select" and table[p.select_kernel].shape["early"] == early
    cl = table[dsa_mod.plan_dsa(1, 1, 2048, 131072, 132, cluster=True).select_kernel]
    assert cl.shape == {"early": True, "cluster": True}
    # the cluster select's three CTAs per SM (so it can sit beside two scoring CTAs): ring, candidates, counter
    assert cl.smem_bytes() == 2 * 4096 * 4 + 4096 * 8 + 8
    # the early chunk policy's CTAs per SM, 3 at next_n = 1 and 2 at next_n = 2, fit (Hopper: 228 KB per SM,
    # 1 KB reserved per CTA), and no more would
    for next_n, per_sm in ((1, 3), (2, 2)):
        early = table[f"dsa_score_early_wgmma_n{next_n}"].smem_bytes()
        assert early == table[f"dsa_score_wgmma_n{next_n}"].smem_bytes() + 128 * 4
        assert per_sm * (early + 1024) <= 228 * 1024 < (per_sm + 1) * (early + 1024)


def test_dsa_plan_clamps_and_refuses():
    assert dsa_mod.plan_dsa(2, 1, 2048, 10**6, 132, max_blocks=100).max_len == 6400   # to the block table
    assert dsa_mod.plan_dsa(2, 1, 2048, 0, 132).max_len == 1
    for bad in (dict(next_n=3), dict(topk=0), dict(max_len=-1), dict(chunk_pages=1024), dict(select_subs=17),
                dict(early="yes")):
        args = dict(batch=2, next_n=1, topk=2048, max_len=100, num_sms=132) | bad
        with pytest.raises(ValueError):
            dsa_mod.plan_dsa(**args)


def test_dsa_plan_constants_match_the_built_metadata(metadata_dir):
    table = dsa_mod.load_kernel_table(metadata_dir / "dsa_indexer.fatbin")   # refuses other constants
    c = table.constants
    assert dsa_mod.STATE_INTS_PER_ROW == c["bins1"] + c["ctr"]
    assert dsa_mod.plan_dsa(1, 1, 2048, 10**6, 132).len_stride % c["select_chunk"] == 0


class _Occupancy:
    """The driver's occupancy answer, from the kernel's shared memory (the only driver call a plan makes)."""

    def max_active_blocks(self, name, threads, smem):
        return max(1, min(2048 // threads, 232448 // max(1, smem)))


def _launcher(table, capability=(9, 0)):
    obj = object.__new__(mla_mod.SparseMlaDecode)
    obj.smem_limit, obj.num_sms, obj.capability = 232448, 132, capability
    obj.kernels = table
    obj.module, obj._occ = _Occupancy(), {}
    return obj


@pytest.mark.parametrize("layout,rows,h,topk,extra", [
    ("v32", 1, 128, 2048, 0), ("v32", 64, 128, 2048, 0), ("v32", 64, 16, 2048, 0), ("v32", 4, 64, 2048, 0),
    ("v32_bf16", 5, 128, 2048, 0), ("v32_bf16", 64, 16, 2048, 0), ("v4", 64, 16, 512, 128), ("v4", 1, 64, 512, 128),
    ("v4_bf16", 8, 32, 512, 128)])
def test_mla_plan_against_the_metadata(mla_table, mla_tuning_table, layout, rows, h, topk, extra):
    # V4's bf16 kernels are in the tuning build only (the production launcher refuses that layout)
    mla = _launcher(mla_tuning_table if layout in mla_mod.TUNING_ONLY_LAYOUTS else mla_table)
    p = mla.make_plan(layout, rows, h, topk, extra)
    info = mla.kernels[p.kernel]
    lay, hb, tile = mla_mod.kernel_shape(info)
    picked = mla.pick_kernel(layout, h, rows=rows, entries=topk + extra)
    # two splits of a wg kernel with a split-pair variant: that variant (it merges them itself)
    assert lay == layout and p.kernel == (picked + "_m" if p.fuse_combine and p.splits == 2 and info.family == "wg"
                                          else picked)
    assert p.threads == info.threads and p.smem == info.smem_bytes(p.per_split) <= mla.smem_limit
    assert p.heads_per_cta == hb and p.grid == (p.splits, -(-h // hb), rows)
    ntot = topk + extra
    assert p.per_split % tile == 0 and (p.splits - 1) * p.per_split < ntot <= p.splits * p.per_split
    assert p.partial_floats == (rows * p.splits * h * 513 if p.splits > 1 else 0)
    # by default only the wg kernels' split pairs merge in the kernel (the ds last-CTA combine measured slower)
    assert p.fuse_combine == (p.splits == 2 and bool(info.shape.get("merges_split_pairs")))
    assert p.workspace_floats == p.partial_floats + p.counter_ints
    assert p.counter_ints == (rows * -(-h // hb) * 16 if p.fuse_combine else 0)
    assert (p.splits, p.per_split) == mla.plan(p.kernel, rows, h, ntot)   # the launcher's own split rule


def test_mla_plan_split_pairs_fuse_by_default(mla_table):
    mla = _launcher(mla_table)
    lossy = dict(lossy_bf16_dequant=True)   # V3.2's wg and cluster kernels: exact for power-of-two scales only
    # the fastest kernel at 64 heads and 64 rows runs in two splits: its _m variant, which merges them itself
    pair = mla.make_plan("v32", 64, 64, 2048, **lossy)
    assert pair.splits == 2 and pair.kernel == "sparse_mla_wg_v32_t64c_m" and pair.fuse_combine
    assert pair.counter_ints == 64 * 16 and pair.workspace_floats == pair.partial_floats + pair.counter_ints
    v4 = mla.make_plan("v4", 64, 64, 512, 128)
    assert v4.splits == 2 and v4.kernel == "sparse_mla_wg_v4_s3_m" and v4.fuse_combine
    # fuse_combine=False: the plain kernel and the combine launch
    plain = mla.make_plan("v32", 64, 64, 2048, fuse_combine=False, **lossy)
    assert plain.kernel == "sparse_mla_wg_v32_t64c" and not plain.fuse_combine and plain.counter_ints == 0
    # a kernel named by the caller is kept: the plain one does not merge, the _m one merges two splits only
    assert not mla.make_plan("v32", 64, 64, 2048, kernel="sparse_mla_wg_v32_t64c", fuse_combine=True,
                             **lossy).fuse_combine
    assert mla.make_plan("v32", 64, 64, 2048, kernel="sparse_mla_wg_v32_t64c_m", **lossy).fuse_combine
    assert not mla.make_plan("v32", 64, 64, 2048, kernel="sparse_mla_wg_v32_t64c_m", splits=3, **lossy).fuse_combine
    assert not mla.make_plan("v32", 64, 64, 2048, kernel="sparse_mla_wg_v32_s3_e", splits=2,
                             fuse_combine=True).fuse_combine   # the wge epilogue does not merge pairs
    # the cluster pair at 128 heads and 32 rows: two splits of 64 clusters, merged by its _m variant
    for layout, topk, extra in (("v32", 2048, 0), ("v4", 512, 128)):
        x = mla.make_plan(layout, 32, 128, topk, extra, **lossy)
        assert (x.kernel, x.splits, x.fuse_combine) == (f"sparse_mla_wg_{layout}_t64x_m", 2, True)
        assert x.counter_ints == 32 * 2 * 16 and x.grid == (2, 2, 32)
        assert mla.make_plan(layout, 32, 128, topk, extra, fuse_combine=False,
                             **lossy).kernel == f"sparse_mla_wg_{layout}_t64x"
    # more splits (fewer rows): the plain kernel with the combine
    few = mla.make_plan("v32", 8, 64, 2048, **lossy)
    assert few.splits > 2 and not few.kernel.endswith("_m") and not few.fuse_combine
    # the ds kernels' last-CTA combine stays opt-in (measured slower)
    ds = mla.make_plan("v4", 8, 16, 512, 128, kernel="sparse_mla_ds_v4_h16_t64_s2", splits=2)
    assert not ds.fuse_combine and mla.make_plan("v4", 8, 16, 512, 128, kernel="sparse_mla_ds_v4_h16_t64_s2",
                                                 splits=2, fuse_combine=True).fuse_combine


def test_mla_plan_choices_and_refusals(mla_table):
    mla = _launcher(mla_table)
    # few rows with many SMs free: the entries are split (and the op needs the split workspace)
    assert mla.make_plan("v32", 1, 16, 2048).splits > 1
    # V4 with page 1 (SGLang's bf16-style flat pools): never the ds / wg kernels, which read past a page-1 entry
    assert mla.kernels[mla.make_plan("v4", 64, 16, 512, 128, page=1).kernel].family not in ("ds", "wg")
    assert mla.make_plan("v32", 8, 128, 2048, splits=1).splits == 1
    with pytest.raises(ValueError, match="not a v32 kernel"):
        mla.make_plan("v32", 8, 128, 2048, kernel="sparse_mla_wg_v4_s3")
    with pytest.raises(ValueError, match="needs an sm_90a GPU"):
        _launcher(mla_table, capability=(12, 0)).make_plan("v32", 8, 128, 2048, kernel="sparse_mla_wg_v32_s3_e")
    # what a kernel can serve is said before whether it rounds (a cluster pair at one head block, lossy or not)
    with pytest.raises(ValueError, match="clusters of 2 head blocks"):
        mla.make_plan("v32", 8, 64, 2048, kernel="sparse_mla_wg_v32_t64x")
    with pytest.raises(ValueError, match="at least one index"):
        mla.make_plan("v32", 8, 128, 0)
    with pytest.raises(ValueError, match="layout must be one of"):
        mla.make_plan("v5", 8, 128, 2048)


@pytest.mark.parametrize("rows,h", [(1, 16), (8, 32), (8, 64), (64, 128), (64, 16), (4, 128), (512, 16), (1, 128)])
def test_default_v32_plan_takes_an_exact_kernel(mla_table, rows, h):
    """V3.2 caches with SGLang's amax/448 scales: only the wge and ds kernels apply an fp32 scale exactly (the fastest
    for h >= 64 is a wg or cluster kernel, for 17-32 heads with few rows a first-version one). The default plan: on
    sm_90a the wge kernel where the fastest is a wg or cluster kernel from 8 rows, else the ds kernel; on other GPUs
    always the ds kernel. (128 heads at one row: the cluster pair rounds, so the default is the ds kernel.)"""
    mla = _launcher(mla_table)
    p = mla.make_plan("v32", rows, h, 2048)
    if h >= 64 and rows >= 8:
        assert p.kernel == "sparse_mla_wg_v32_s3_e" and mla.kernels[p.kernel].shape["exact_scales"]
        # as for the wg kernels a whole top-2048 row fits one CTA (splits only to fill the GPU)
        assert p.smem <= mla.smem_limit and mla.kernels[p.kernel].smem_bytes(2048) <= mla.smem_limit
    else:
        assert mla.kernels[p.kernel].family == "ds" and p.kernel == mla_mod.ds_kernel_name("v32", h, rows, 2048)
    assert mla_mod.applies_scales_exactly(mla.kernels[p.kernel])
    other = _launcher(mla_table, capability=(12, 0)).make_plan("v32", rows, h, 2048)
    assert other.kernel == mla_mod.ds_kernel_name("v32", h, rows, 2048)
    # the lossy opt-in changes nothing where scales are powers of two by format (V4) or there are none (bf16 KV)
    lossy = dict(lossy_bf16_dequant=True)
    assert mla.make_plan("v4", rows, h, 512, 128, **lossy).kernel == mla.make_plan("v4", rows, h, 512, 128).kernel
    assert mla.make_plan("v32_bf16", rows, h, 2048, **lossy).kernel == mla.pick_kernel("v32_bf16", h, rows=rows)
