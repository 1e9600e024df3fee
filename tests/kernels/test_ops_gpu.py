"""GPU tests of the serving ops (pdserve_kernels.ops; marker `gpu`): on fresh random inputs each op gives what
the launcher gives with the same kernel and plan; a CUDA graph of several layer calls, replayed with new inputs
(new lengths too) written into the same buffers, equals eager calls; a launch on a non-default stream is ordered
on that stream; two streams with their own workspaces run at once and both are right; no host sync inside
either op (torch.cuda.set_sync_debug_mode("error"), checked to catch the launcher's own .item()); both ops
under torch.compile(fullgraph=True).

Top-k rows are compared as sets (sorted): the kernel's order within a row is not a contract; a replay and eager
calls on the same inputs may differ only among positions tied exactly at the k-th score. Attention outputs must be
bit-equal: same kernel, same plan, deterministic reduction."""


import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU kernel tests need it")

from tests.kernels.topk_sets import top_k_difference  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    from pdserve_kernels import ops

    ops.indexer_for(), ops.mla_for()   # load both modules before any capture
    return ops


def _dsa_inputs(gen, lens, next_n=1, lens_2d=False, max_blocks=None):
    from pdserve_kernels.reference import make_inputs

    return make_inputs(len(lens), next_n, lens, generator=gen, max_blocks=max_blocks, explicit_lens=lens_2d)


def _rows_sorted(t):
    return torch.sort(t, dim=1).values


def _mla_inputs(gen, layout, B, h, topk, topk_extra=0, flat_bf16=False):
    from pdserve_kernels.sparse_mla_reference import make_inputs

    if flat_bf16:   # SGLang's bf16 pool: [slots, 1, 576], indices are slots
        slots = 4 * topk + 64
        kv = torch.randn((slots, 1, 576), device="cuda", generator=gen).to(torch.bfloat16)
        ind = torch.stack([torch.randperm(slots, device="cuda", generator=gen)[:topk] for _ in range(B)]).int()
        ind[torch.rand(ind.shape, device="cuda", generator=gen) < 0.1] = -1
        q = torch.randn((B, h, 576), device="cuda", generator=gen).to(torch.bfloat16)
        return dict(q=q, kv=kv, indices=ind.view(B, 1, topk).contiguous(), sinks=None)
    inp = make_inputs(layout, B, 1, h, topk, topk_extra=topk_extra, generator=gen)
    return {k: inp[k] for k in ("q", "kv", "indices", "sinks", "extra_kv", "extra_indices") if k in inp}


def _mla_extra(inp):
    return {k: inp[k] for k in ("sinks", "extra_kv", "extra_indices") if k in inp}


# ---- op == launcher, same kernel ----

VARIANTS = {"base": dict(early=False), "early": dict(early=True, cluster=False),
            "cluster": dict(early=True, cluster=True)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("lens,next_n,lens_2d", [([1, 2047, 2049, 7000, 40000], 1, True),
                                                  ([100, 70001], 1, False), ([3000, 513, 9000], 2, False)])
def test_indexer_op_equals_launcher(ops, gen, lens, next_n, lens_2d, variant):
    inp = _dsa_inputs(gen, lens, next_n, lens_2d)
    B = len(lens)
    plan = ops.DsaIndexerPlan(B, next_n, 2048, max(lens), max_blocks=inp["block_table"].shape[1], **VARIANTS[variant])
    assert (plan.plan.early, plan.plan.cluster) == (variant != "base", variant == "cluster")
    got = plan(**inp)
    want = ops.indexer_for()(**inp, topk=2048, max_len=max(lens), **VARIANTS[variant])
    torch.cuda.synchronize()
    assert got.shape == want.shape == (B * next_n, 2048) and got.dtype == torch.int32
    assert torch.equal(_rows_sorted(got), _rows_sorted(want))


@pytest.mark.parametrize("layout,B,h,topk,extra", [("v32", 1, 128, 2048, 0), ("v32", 8, 16, 2048, 0),
                                                   ("v32", 64, 128, 2048, 0), ("v32", 64, 16, 2048, 0),
                                                   ("v32_bf16", 4, 128, 2048, 0), ("v4", 8, 64, 512, 128)])
def test_mla_op_equals_launcher(ops, gen, layout, B, h, topk, extra):
    inp = _mla_inputs(gen, layout, B, h, topk, extra)
    plan = ops.SparseMlaPlan(layout, B, 1, h, topk, topk_extra=extra)
    o, lse = plan(inp["q"], inp["kv"], inp["indices"], 0.1352, **_mla_extra(inp))
    lo, llse = ops.mla_for()(inp["q"], inp["kv"], inp["indices"], 0.1352, layout=layout.split("_")[0],
                             kernel=plan.plan.kernel, splits=plan.plan.splits, **_mla_extra(inp))
    torch.cuda.synchronize()
    assert not torch.isnan(o.float()).any() and torch.equal(o, lo) and torch.equal(lse, llse)


def test_mla_op_takes_sglang_bf16_pool_as_is(ops, gen):
    # q [B, h, 576] and kv [slots, 1, 576]: out follows q's rank ([B, h, 512]), no copy of the pool.
    inp = _mla_inputs(gen, "v32_bf16", 3, 128, 2048, flat_bf16=True)
    plan = ops.SparseMlaPlan("v32", 3, 1, 128, 2048, bf16_kv=True, page=1)
    o, lse = plan(inp["q"], inp["kv"], inp["indices"], 0.1352)
    lo, llse = ops.mla_for()(inp["q"], inp["kv"], inp["indices"], 0.1352, layout="v32", kernel=plan.plan.kernel,
                             splits=plan.plan.splits)
    torch.cuda.synchronize()
    assert o.shape == (3, 128, 512) and lse.shape == (3, 128)
    assert torch.equal(o, lo.view(3, 128, 512)) and torch.equal(lse, llse.view(3, 128))


@pytest.mark.parametrize("B,h", [(1, 16), (1, 64), (1, 128), (8, 32), (8, 128), (64, 16), (64, 64), (64, 128)])
def test_the_default_is_exact_on_sglang_scales(ops, gen, B, h):
    """V3.2 FP8 caches written the way SGLang writes them (fp32 amax/448 tile scales): the default plan's output and
    the default functional call's (sparse_mla_decode() without options; issue 38 item 2) are at the bf16 level of the
    fp32 reference of the same bytes: relative L2 error <= 3e-3, worst (row, head) <= 5e-3, lse within 1e-3 (the ds
    kernels measured 1.63-1.68e-3, worst <= 2.55e-3; the wg kernels 6.9-7.6e-3, worst 5-10e-2: NOTES.md). On sm_90a
    the wge kernel from 8 rows at h >= 64, else a ds kernel. Prints the figures (run with -s)."""
    from pdserve_kernels import sparse_mla_decode
    from pdserve_kernels.sparse_mla_reference import make_inputs, reference_from_inputs

    inp = make_inputs("v32", B, 1, h, 2048, generator=gen, scale_mode="amax448")
    ref_o, ref_lse = reference_from_inputs(inp, 0.1352)
    fin = ~torch.isinf(ref_lse)
    plan = ops.SparseMlaPlan("v32", B, 1, h, 2048)
    for label, (o, lse) in (("plan", plan(inp["q"], inp["kv"], inp["indices"], 0.1352, sinks=inp["sinks"])),
                            ("call", sparse_mla_decode(inp["q"], inp["kv"], inp["indices"], 0.1352, layout="v32",
                                                       sinks=inp["sinks"]))):
        num = (o.float() - ref_o)[fin].norm(dim=-1)
        den = ref_o[fin].norm(dim=-1).clamp_min(1e-30)
        rel, worst = (num.norm() / den.norm()).item(), (num / den).max().item()
        dlse = (lse[fin] - ref_lse[fin]).abs().max().item()
        print(f"amax/448 B={B} h={h} default {label}: {plan.plan.kernel} rel L2 {rel:.2e} worst {worst:.2e} "
              f"lse {dlse:.1e}")
        assert rel <= 3e-3 and worst <= 5e-3 and dlse <= 1e-3, \
            f"{label} {plan.plan.kernel}: relative error {rel:.2e}, worst {worst:.2e}, lse {dlse:.1e}"
    if ops.mla_for().capability[0] == 9 and h >= 64 and B >= 8:
        assert plan.plan.kernel == "sparse_mla_wg_v32_s3_e"
    else:
        assert ops.mla_for().kernels[plan.plan.kernel].family == "ds"
    assert (lse[fin] - ref_lse[fin]).abs().max().item() <= 1e-3


# ---- CUDA graphs ----

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cuda_graph_of_layer_calls_replays_with_new_inputs(ops, gen, variant):
    """Capture N layers (indexer + fp8 sparse MLA each, the plans made once before capture); write new inputs
    (new lengths below the bound, new q, caches, indices) into the captured buffers; replay == eager. Every
    indexer variant (early: its select grid reads the lengths before the PDL wait; cluster: a cluster launch with
    PDL, both inside the graph)."""
    layers, B, bound = 3, 4, 188 * 64
    plan_i = ops.DsaIndexerPlan(B, 1, 2048, bound, max_blocks=bound // 64, **VARIANTS[variant])
    plan_m = ops.SparseMlaPlan("v32", B, 1, 128, 2048)
    plan_m16 = ops.SparseMlaPlan("v32", B, 1, 16, 2048)   # a plan with splits (few rows, few heads)
    assert plan_m16.plan.splits > 1

    def fresh():
        di = []
        for _ in range(layers):   # the pool holds `bound` keys per request; the lengths are new, below the bound
            d = _dsa_inputs(gen, [bound] * B, max_blocks=bound // 64)
            d["context_lens"] = torch.randint(1, bound + 1, (B,), generator=gen, device="cuda", dtype=torch.int32)
            di.append(d)
        mi = [_mla_inputs(gen, "v32", B, 128, 2048) for _ in range(layers)]
        m16 = [_mla_inputs(gen, "v32", B, 16, 2048) for _ in range(layers)]
        return di, mi, m16

    def run(di, mi, m16):
        outs = []
        for d, m, s in zip(di, mi, m16, strict=False):
            outs.append(plan_i(**d))
            outs.extend(plan_m(m["q"], m["kv"], m["indices"], 0.1352, sinks=m["sinks"]))
            outs.extend(plan_m16(s["q"], s["kv"], s["indices"], 0.1352, sinks=s["sinks"]))
        return outs

    static = fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(*static)   # warm-up outside capture, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(*static)
    for _ in range(2):
        new = fresh()
        for group_s, group_n in zip(static, new, strict=False):      # same shapes: write the new values in place
            for s, n in zip(group_s, group_n, strict=False):
                for k, v in s.items():
                    if isinstance(v, torch.Tensor):
                        v.copy_(n[k])
        graph.replay()
        eager = run(*static)
        torch.cuda.synchronize()
        for i, (g, e) in enumerate(zip(captured, eager, strict=False)):
            if g.dtype == torch.int32:
                d = static[0][i // 5]   # per layer: the indexer's output, then (out, lse) twice
                scores = ops.indexer_for()(**d, topk=2048, max_len=bound, return_scores=True, path="split",
                                           chunk_pages=plan_i.plan.chunk_pages, **VARIANTS[variant])[1]
                problem = top_k_difference(g, e, scores, d["context_lens"].tolist(), 2048)
                assert problem is None, f"indexer output {i} after replay: {problem}"
            else:
                assert torch.equal(g, e), f"MLA output {i} differs after replay"


# ---- streams ----

def test_launch_on_a_side_stream_is_ordered_there(ops, gen):
    """The side stream sleeps, then writes the inputs, then runs the ops: a launch on any other stream would
    read the old inputs and give a different result."""
    lens = [5000, 30000]
    old, new = _dsa_inputs(gen, lens), _dsa_inputs(gen, lens)
    mold, mnew = _mla_inputs(gen, "v32", 2, 64, 2048), _mla_inputs(gen, "v32", 2, 64, 2048)
    plan_i = ops.DsaIndexerPlan(2, 1, 2048, max(lens))
    plan_m = ops.SparseMlaPlan("v32", 2, 1, 64, 2048)
    want_i, (want_o, _) = plan_i(**new), plan_m(mnew["q"], mnew["kv"], mnew["indices"], 0.1, sinks=mnew["sinks"])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)   # ~0.1 s of GPU time before the copies
        for k in old:
            old[k].copy_(new[k])
        for k in ("q", "kv", "indices", "sinks"):
            mold[k].copy_(mnew[k])
        got_i = plan_i(**old)
        got_o, _ = plan_m(mold["q"], mold["kv"], mold["indices"], 0.1, sinks=mold["sinks"])
    side.synchronize()
    assert torch.equal(_rows_sorted(got_i), _rows_sorted(want_i))
    assert torch.equal(got_o, want_o)


def test_two_streams_with_own_workspaces_overlap_correctly(ops, gen):
    lens_a, lens_b = [20000, 3000, 9000], [40000, 100, 2500]
    a, b = _dsa_inputs(gen, lens_a), _dsa_inputs(gen, lens_b)
    pa, pb = ops.DsaIndexerPlan(3, 1, 2048, 40000), ops.DsaIndexerPlan(3, 1, 2048, 40000)
    ma, mb = _mla_inputs(gen, "v32", 2, 16, 2048), _mla_inputs(gen, "v32", 2, 16, 2048)
    qa, qb = ops.SparseMlaPlan("v32", 2, 1, 16, 2048), ops.SparseMlaPlan("v32", 2, 1, 16, 2048)
    want = [pa(**a), pb(**b), qa(ma["q"], ma["kv"], ma["indices"], 0.1)[0],
            qb(mb["q"], mb["kv"], mb["indices"], 0.1)[0]]
    torch.cuda.synchronize()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    got = []
    for _ in range(3):
        with torch.cuda.stream(s1):
            torch.cuda._sleep(20_000_000)
            r1 = [pa(**a), qa(ma["q"], ma["kv"], ma["indices"], 0.1)[0]]
        with torch.cuda.stream(s2):
            torch.cuda._sleep(20_000_000)
            r2 = [pb(**b), qb(mb["q"], mb["kv"], mb["indices"], 0.1)[0]]
        got.append((r1, r2))
    torch.cuda.synchronize()
    for r1, r2 in got:
        assert torch.equal(_rows_sorted(r1[0]), _rows_sorted(want[0]))
        assert torch.equal(_rows_sorted(r2[0]), _rows_sorted(want[1]))
        assert torch.equal(r1[1], want[2]) and torch.equal(r2[1], want[3])


def test_launcher_keeps_a_workspace_per_stream(ops, gen):
    ind = ops.indexer_for()
    inp = _dsa_inputs(gen, [30000, 5000])
    want = ind(**inp, topk=2048, max_len=30000)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    outs = []
    for s in (s1, s2, s1, s2):
        with torch.cuda.stream(s):
            outs.append(ind(**inp, topk=2048, max_len=30000))
    torch.cuda.synchronize()
    assert ind._states[s1.cuda_stream].data_ptr() != ind._states[s2.cuda_stream].data_ptr()
    for o in outs:
        assert torch.equal(_rows_sorted(o), _rows_sorted(want))


# ---- no host sync, torch.compile ----

def test_no_host_sync_inside_the_ops(ops, gen):
    inp = _dsa_inputs(gen, [9000, 300])
    m = _mla_inputs(gen, "v32", 2, 128, 2048)
    plan_i = ops.DsaIndexerPlan(2, 1, 2048, 9000)
    plan_m = ops.SparseMlaPlan("v32", 2, 1, 128, 2048)
    plan_i(**inp), plan_m(m["q"], m["kv"], m["indices"], 0.1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            out = plan_i(**inp)
            o, _lse = plan_m(m["q"], m["kv"], m["indices"], 0.1, sinks=m["sinks"])
        # the check is live: the launcher's convenience path (max_len read from the lengths) does sync
        with pytest.raises(RuntimeError, match="synchroniz"):
            ops.indexer_for()(**inp, topk=2048)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert out.shape == (2, 2048) and o.shape == (2, 1, 128, 512)


def test_ops_under_torch_compile(ops, gen):
    inp = _dsa_inputs(gen, [9000, 2100])
    m = _mla_inputs(gen, "v32", 2, 64, 2048)
    plan_i = ops.DsaIndexerPlan(2, 1, 2048, 9000)
    plan_m = ops.SparseMlaPlan("v32", 2, 1, 64, 2048)

    def step(q, w, kv, ctx, bt, mq, mkv, mind):
        idx = plan_i(q, w, kv, ctx, bt)
        o, lse = plan_m(mq, mkv, mind, 0.1352)
        return idx, o.float() * 2, lse

    args = (*(inp[k] for k in ("q", "weights", "kv_cache", "context_lens", "block_table")),
            m["q"], m["kv"], m["indices"])
    want = step(*args)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    torch.cuda.synchronize()
    assert torch.equal(_rows_sorted(got[0]), _rows_sorted(want[0]))
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_ops_refuse_mismatched_plans_and_workspaces(ops, gen):
    """One clear error, before any launch, for a workspace or plan that does not fit the inputs."""
    inp = _dsa_inputs(gen, [9000, 300])
    small = ops.DsaWorkspace(1, 9000)
    with pytest.raises(ValueError, match="too small"):
        ops.DsaIndexerPlan(2, 1, 2048, 9000, workspace=small)
    plan = ops.DsaIndexerPlan(2, 1, 2048, 9000)
    args = [inp[k] for k in ("q", "weights", "kv_cache", "context_lens", "block_table")]
    # a Python exception raised inside a dispatcher op keeps its message (its type may be re-raised as RuntimeError)
    refused = (ValueError, RuntimeError)
    with pytest.raises(refused, match="scratch must be"):
        torch.ops.pdserve.dsa_indexer_topk(*args, plan.workspace.state, small.scratch, 2048, 9000,
                                           plan.plan.chunk_pages, plan.plan.select_subs)
    with pytest.raises(refused, match="context_lens must be int32"):
        plan(*args[:3], args[3].long(), args[4])
    m = _mla_inputs(gen, "v32", 2, 16, 2048)
    mp = ops.SparseMlaPlan("v32", 2, 1, 16, 2048)
    assert mp.plan.splits > 1
    call = [m["q"], m["kv"], m["indices"], None, None, None]
    with pytest.raises(refused, match="do not cover"):
        torch.ops.pdserve.sparse_mla_decode(*call, mp.workspace.buffer, 0.1, "v32", mp.plan.kernel, 1, 64)
    with pytest.raises(refused, match="is not a v32 kernel"):
        torch.ops.pdserve.sparse_mla_decode(*call, mp.workspace.buffer, 0.1, "v32", "sparse_mla_wg_v4_s3",
                                            mp.plan.splits, mp.plan.per_split)
    with pytest.raises(refused, match="workspace must be"):
        torch.ops.pdserve.sparse_mla_decode(*call, mp.workspace.buffer[:10], 0.1, "v32", mp.plan.kernel,
                                            mp.plan.splits, mp.plan.per_split)
