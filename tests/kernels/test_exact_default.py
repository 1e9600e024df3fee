"""CPU-only (issue 38 items 2 and 3): the sparse MLA decode library is exact on any fp32 scale by default, the faster
lossy path is an explicit opt-in (`lossy_bf16_dequant=True`), the SGLang plugin plans through the launcher's one kernel
table, and every production kernel is one that table chooses for a shape the plugin serves, on a GPU the fatbin runs
on: V4's bf16-KV kernels, which no plugin call could reach (SGLang's V4 cache is FP8), are in the tuning build only,
and the production launcher refuses that layout, saying why and how to load them. No GPU: the launcher is built around
the metadata of the production and tuning builds (conftest: build.sh METADATA_ONLY=1), the driver's occupancy answer
modelled from shared memory as in test_ops.py."""

import importlib
import itertools
import pathlib
import types

import pytest

torch = pytest.importorskip("torch", reason="the plugin's plans and the launcher's call path import torch")

mla_mod = importlib.import_module("pdserve_kernels.sparse_mla_decode")   # the package re-exports a function
ops = importlib.import_module("pdserve_kernels.ops")
plans_mod = importlib.import_module("pdserve_kernels.sglang_plugin.plans")
hooks = importlib.import_module("pdserve_kernels.sglang_plugin.hooks")
decision = importlib.import_module("pdserve_kernels.sglang_plugin.decide")

REPO = pathlib.Path(__file__).resolve().parents[2]
HOPPER_SMEM, SM120_SMEM = 232448, 101376
# What rounds e4m3 x fp32 scale to bf16 in the production fatbin: V3.2's first-version fp8 kernels, its wg kernel and
# its wgt / cluster kernels (NOTES.md "Exact by default"). Everything else applies the scales exactly.
LOSSY = {"sparse_mla_v32_h32_t64", "sparse_mla_v32_h16_t32", "sparse_mla_wg_v32_s3_c2", "sparse_mla_wg_v32_t64c",
         "sparse_mla_wg_v32_t64c_m", "sparse_mla_wg_v32_t64x", "sparse_mla_wg_v32_t64x_m"}


class _Occupancy:
    """The driver's occupancy answer, from the kernel's shared memory (the only driver call a plan makes)."""

    def max_active_blocks(self, name, threads, smem):
        return max(1, min(2048 // threads, HOPPER_SMEM // max(1, smem)))


def _launcher(table, capability=(9, 0), smem_limit=HOPPER_SMEM):
    obj = object.__new__(mla_mod.SparseMlaDecode)
    obj.smem_limit, obj.num_sms, obj.capability = smem_limit, 132, capability
    obj.kernels, obj.module, obj._occ = table, _Occupancy(), {}
    obj.torch, obj.device = torch, torch.device("cpu")
    return obj


# The GPUs the fatbin has cubins for (build.sh: sm_90a, sm_120a), which are also the plugin's (decide.SUPPORTED_SM).
GPUS = {(9, 0): HOPPER_SMEM, (12, 0): SM120_SMEM}
ROWS = (*range(1, 161), 192, 256, 384, 512)


def test_the_gpus_are_the_plugins():
    assert set(GPUS) == set(decision.SUPPORTED_SM)


# ---- item 2: exact by default ----

def test_which_production_kernels_round_scaled_values(mla_table):
    lossy = {n for n, k in mla_table.kernels.items() if not mla_mod.applies_scales_exactly(k)}
    assert lossy == LOSSY
    # exact: V4 (UE8M0 scales, powers of two) and bf16 KV whatever the family; V3.2 FP8 the ds and wge kernels
    for name, info in mla_table.kernels.items():
        if info.family != "combine" and info.shape["layout"] == "v32" and name not in LOSSY:
            assert info.family == "ds" or info.shape["exact_scales"], name


@pytest.mark.parametrize("capability", sorted(GPUS))
@pytest.mark.parametrize("layout", ["v4", "v32", "v4_bf16", "v32_bf16"])
def test_the_default_plan_is_exact_for_every_shape(mla_table, mla_tuning_table, capability, layout):
    """make_plan without options (what sparse_mla_decode(), SparseMlaPlan and the plugin run) never takes a kernel
    that rounds a scaled value; where no exact kernel fits (V3.2 FP8 on sm_120's 99 KB) it refuses, saying so. (V4's
    bf16 KV: the tuning build's launcher, the production one refuses the layout.)"""
    table = mla_tuning_table if layout in mla_mod.TUNING_ONLY_LAYOUTS else mla_table
    mla = _launcher(table, capability, GPUS[capability])
    v4 = layout.startswith("v4")
    refused = 0
    for h, rows, (topk, extra) in itertools.product((8, 16, 24, 32, 48, 64, 96, 128, 192, 256), ROWS[::3],
                                                     ((512, 128), (1024, 128)) if v4 else ((2048, 0), (300, 0))):
        try:
            plan = mla.make_plan(layout, rows, h, topk, extra)
        except ValueError as e:
            assert layout == "v32" and capability == (12, 0), (h, rows, str(e))
            assert "no V3.2 FP8 kernel exact for fp32 scales fits this GPU" in str(e)
            assert "lossy_bf16_dequant=True" in str(e)
            refused += 1
            continue
        assert mla_mod.applies_scales_exactly(table[plan.kernel]), (h, rows, plan.kernel)
    assert (refused > 0) == (layout == "v32" and capability == (12, 0))


def test_128_heads_at_one_row_is_exact_again(mla_table):
    """The cluster pair became the fastest choice at every row count (2026-12-02); at V3.2 it rounds, so the default
    there is the ds kernel again, and the pair needs the opt-in."""
    mla = _launcher(mla_table)
    assert mla.make_plan("v32", 1, 128, 2048).kernel == "sparse_mla_ds_v32_h32_t64_s2"
    assert mla.make_plan("v32", 1, 128, 2048, lossy_bf16_dequant=True).kernel == "sparse_mla_wg_v32_t64x"
    assert mla.make_plan("v32", 64, 128, 2048).kernel == "sparse_mla_wg_v32_s3_e"
    assert mla.make_plan("v32", 64, 128, 2048, lossy_bf16_dequant=True).kernel == "sparse_mla_wg_v32_t64x"
    # V4's scales are powers of two: its fastest kernels are its default
    assert mla.make_plan("v4", 64, 128, 512, 128).kernel == "sparse_mla_wg_v4_t64x"


def test_a_lossy_kernel_needs_the_opt_in_however_it_is_chosen(mla_table, monkeypatch):
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "auto")
    mla = _launcher(mla_table)
    for name in sorted(LOSSY):   # named outright
        h = 128 if "t64x" in name else 64 if "wg" in name else 16 if "h16" in name else 32
        with pytest.raises(ValueError, match=f"kernel '{name}' rounds each e4m3 value .*lossy_bf16_dequant=True"):
            mla.make_plan("v32", 8, h, 2048, kernel=name)
        if "h16_t32" not in name:   # (the small-smem kernel's ring needs a split below 2048 entries)
            assert mla.make_plan("v32", 8, h, 2048, kernel=name, lossy_bf16_dequant=True).kernel.startswith(name)
    for variant, h in (("wg", 128), ("wgx", 128), ("", 32)):   # a variant that forces a rounding family
        with pytest.raises(ValueError, match=r"name an exact kernel .ds, wge. or let the launcher choose"):
            mla.make_plan("v32", 64, h, 2048, variant=variant)
    for variant in ("ds", "wge", "auto"):   # the exact ones
        assert mla_mod.applies_scales_exactly(mla_table[mla.make_plan("v32", 64, 128, 2048, variant=variant).kernel])
    # the environment's variant is no way around it either
    monkeypatch.setattr(mla_mod, "FP8_VARIANT", "wgx")
    with pytest.raises(ValueError, match="PDSERVE_SPARSE_MLA_FP8_OPT='wgx' asks for another"):
        mla.make_plan("v32", 64, 128, 2048)
    assert mla.make_plan("v32", 64, 128, 2048, lossy_bf16_dequant=True).kernel == "sparse_mla_wg_v32_t64x"


def test_sm120_runs_v32_fp8_only_with_the_opt_in(mla_table):
    mla = _launcher(mla_table, (12, 0), SM120_SMEM)
    with pytest.raises(ValueError, match=f"fits this GPU .{SM120_SMEM} B of shared memory per block"):
        mla.make_plan("v32", 8, 16, 2048)
    assert mla.make_plan("v32", 8, 16, 2048, lossy_bf16_dequant=True).kernel == "sparse_mla_v32_h16_t32"
    assert mla.make_plan("v32_bf16", 8, 16, 2048).kernel == "sparse_mla_v32b_h16_t32"   # no scales: exact


def test_the_functional_call_is_exact_by_default(mla_table, monkeypatch):
    """SparseMlaDecode.__call__ (what sparse_mla_decode() runs), up to the launch: the default takes an exact kernel,
    a forced rounding one is refused before anything is allocated or launched, the opt-in lets it run."""
    mla = _launcher(mla_table)
    launched = []
    monkeypatch.setattr(mla, "launch", lambda plan, *a, **k: launched.append(plan), raising=False)
    monkeypatch.setattr(mla, "_counters", lambda n: torch.zeros(max(n, 1), dtype=torch.int32), raising=False)
    rows, h = 64, 128
    q = torch.zeros(rows, 1, h, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 64, 1, 656, dtype=torch.uint8)
    ind = torch.zeros(rows, 1, 2048, dtype=torch.int32)
    mla(q, kv, ind, 0.1352, layout="v32")
    assert launched[-1].kernel == "sparse_mla_wg_v32_s3_e"
    with pytest.raises(ValueError, match="lossy_bf16_dequant=True"):
        mla(q, kv, ind, 0.1352, layout="v32", variant="wgx")
    assert len(launched) == 1
    mla(q, kv, ind, 0.1352, layout="v32", variant="wgx", lossy_bf16_dequant=True)
    assert launched[-1].kernel == "sparse_mla_wg_v32_t64x"


# ---- item 3: one table, every production kernel reachable ----

class _Workspace:
    @classmethod
    def for_plan(cls, plan, device=None):
        return cls()

    def fits(self, plan):
        return True


@pytest.fixture()
def plugin_plans(monkeypatch):
    """The plugin's PlanCache with the launcher of the GPU it is asked about (no workspace memory, one stream)."""
    launchers = {}
    monkeypatch.setattr(ops, "mla_for", lambda device=None: launchers[device.index])
    monkeypatch.setattr(ops, "MlaWorkspace", _Workspace)
    monkeypatch.setattr(plans_mod, "_stream_key", lambda device: 0)
    return launchers


def _plugin_kernels(table, launchers, capability, *, lossy):
    """Every kernel the plugin's plans take on one GPU over the shapes SGLang's V3.2 decode hands it: 8-128 heads per
    GPU (TP 16 down to 1), 1-512 rows, top-2048; the fp8 cache in 64-token pages, the bf16 pool flat (page 1)."""
    launchers[0] = _launcher(table, capability, GPUS[capability])
    cache, device, chosen = plans_mod.PlanCache(), torch.device("cuda", 0), set()
    for h, rows, bf16_kv in itertools.product((8, 16, 32, 64, 128), ROWS, (False, True)):
        try:
            plan = cache.mla(device, hooks.MLA_LAYOUT, rows, h, 2048, bf16_kv=bf16_kv, page=1 if bf16_kv else 64,
                             lossy_bf16_dequant=lossy)
        except ValueError:   # the hooks hand such a call back to SGLang (a fallback line)
            assert not bf16_kv and not lossy and capability == (12, 0)
            continue
        # the plugin's plan is the launcher's, shape for shape: one table
        same = launchers[0].make_plan(hooks.MLA_LAYOUT + ("_bf16" if bf16_kv else ""), rows, h, 2048,
                                      page=1 if bf16_kv else 64, lossy_bf16_dequant=lossy)
        assert plan.plan == same
        chosen.add(plan.plan.kernel)
    return chosen


def test_every_production_kernel_is_reachable_from_the_plugin(mla_table, plugin_plans):
    attention = {n for n, k in mla_table.kernels.items() if k.family != "combine"}
    exact = set().union(*(_plugin_kernels(mla_table, plugin_plans, c, lossy=False) for c in GPUS))
    lossy = set().union(*(_plugin_kernels(mla_table, plugin_plans, c, lossy=True) for c in GPUS))
    # by default the plugin runs exact kernels only; with $PDSERVE_DSA_LOSSY_BF16_DEQUANT=1 it reaches the rounding
    # ones at the shapes where they are the fastest (the cluster pair at 128 heads among them)
    assert all(mla_mod.applies_scales_exactly(mla_table[n]) for n in exact)
    assert lossy - exact == LOSSY
    # V4's FP8 kernels come through the V4 hooks (v4_hooks.py), every one of them ...
    v4 = set().union(*(_plugin_v4_kernels(mla_table, plugin_plans, c) for c in GPUS))
    assert v4 == {n for n in attention if mla_table[n].shape["layout"] == "v4"}
    # ... and nothing is left: the bf16 V4 kernels, which no plugin call could reach (SGLang's V4 pool is FP8 only,
    # 584 B per entry, asserted by its pool), are in the tuning build only
    assert attention == exact | lossy | v4


def test_the_production_launcher_refuses_bf16_v4_saying_why_and_how(mla_table, plugin_plans, monkeypatch):
    """Every way into the production launcher with V4's bf16 layout (a plan, a kernel choice, a named v4b kernel, the
    plugin's plans, the functional call on a bf16 cache) is refused before anything runs, with the layout, the reason
    and the fix (the tuning fatbin) in the message."""
    assert not [n for n, k in mla_table.kernels.items() if k.shape.get("layout") == "v4_bf16"]
    mla = _launcher(mla_table)
    message = (r"layout 'v4_bf16' has no kernel in sparse_mla_decode\.fatbin: the production build is FP8-only for V4 "
               r"because SGLang's V4 KV cache is FP8 .*bash kernels/tuning/build.sh .*"
               r"PDSERVE_SPARSE_MLA_FATBIN=OUTDIR/sparse_mla_decode_tuning\.fatbin")
    with pytest.raises(ValueError, match=message):
        mla.make_plan("v4_bf16", 8, 64, 512, 128)
    with pytest.raises(ValueError, match=message):
        mla.make_plan("v4_bf16", 8, 64, 512, 128, kernel="sparse_mla_v4b_h64_t64")
    with pytest.raises(ValueError, match=message):
        mla.pick_kernel("v4_bf16", 16, rows=1)
    plugin_plans[0] = mla
    with pytest.raises(ValueError, match=message):
        plans_mod.PlanCache().mla(torch.device("cuda", 0), "v4", 8, 64, 512, topk_extra=128, bf16_kv=True, page=64)
    launched = []
    monkeypatch.setattr(mla, "launch", lambda plan, *a, **k: launched.append(plan), raising=False)
    q = torch.zeros(2, 1, 64, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=message):   # layout "v4" with a bf16 cache: the bf16 layout
        mla(q, torch.zeros(4, 64, 1, 512, dtype=torch.bfloat16), torch.zeros(2, 1, 64, dtype=torch.int32), 0.04)
    assert not launched
    # the layouts the production build has are never refused, whatever table is asked
    for layout in ("v4", "v32", "v32_bf16"):
        assert mla_mod.layout_refusal(layout, mla_table) is None


def test_the_tuning_build_runs_bf16_v4_with_the_launchers_choice(mla_tuning_table, monkeypatch):
    """The tuning fatbin's launcher serves "v4_bf16" through the same table: a v4b kernel for every shape on both GPUs
    (every one of the four somewhere), and the functional call on a bf16 V4 cache launches it."""
    assert mla_mod.layout_refusal("v4_bf16", mla_tuning_table) is None
    chosen = set()
    for capability, h, rows in itertools.product(sorted(GPUS), (8, 16, 32, 64, 128), ROWS[::5]):
        plan = _launcher(mla_tuning_table, capability, GPUS[capability]).make_plan("v4_bf16", rows, h, 512, 128)
        assert plan.kernel.startswith("sparse_mla_v4b_"), (capability, h, rows, plan.kernel)
        assert mla_mod.kernel_shape(mla_tuning_table[plan.kernel])[0] == "v4_bf16"
        chosen.add(plan.kernel)
    assert chosen == {n for n, k in mla_tuning_table.kernels.items()
                      if k.shape.get("layout") == "v4_bf16" and k.shape.get("retired")}
    mla = _launcher(mla_tuning_table)
    launched = []
    monkeypatch.setattr(mla, "launch", lambda plan, *a, **k: launched.append(plan), raising=False)
    mla(torch.zeros(2, 1, 16, 512, dtype=torch.bfloat16), torch.zeros(4, 64, 1, 512, dtype=torch.bfloat16),
        torch.zeros(2, 1, 64, dtype=torch.int32), 0.04)
    assert [p.kernel for p in launched] == [mla.make_plan("v4_bf16", 2, 16, 64).kernel]
    assert launched[0].kernel.startswith("sparse_mla_v4b_")


def _plugin_v4_kernels(table, launchers, capability):
    """Every kernel the plugin's plans take on one GPU over the shapes SGLang's V4 decode hands it (v4_hooks._mla):
    the layer's real heads, 8-128 per GPU (V4-Flash's 64 under TP 8 down to 1; 128 for the full model); the window's
    128 entries at page 256 plus the C4 layers' 512 picks at page 64, the C128 layers' 64-1024 entries at page 2, or
    nothing (window-only layers); SGLang's V4 cache is FP8 only."""
    launchers[0] = _launcher(table, capability, GPUS[capability])
    cache, device, chosen = plans_mod.PlanCache(), torch.device("cuda", 0), set()
    sources = ((0, 256), (512, 64), (64, 2), (128, 2), (1024, 2))
    for h, rows, (extra, page) in itertools.product((8, 16, 32, 64, 128), ROWS, sources):
        plan = cache.mla(device, "v4", rows, h, 128, topk_extra=extra, bf16_kv=False, page=page)
        assert plan.plan == launchers[0].make_plan("v4", rows, h, 128, extra, page=page)   # one table
        chosen.add(plan.plan.kernel)
    return chosen


def test_no_production_kernel_is_left_that_no_shape_chooses(mla_table, mla_tuning_table):
    """Retired kernels live in the tuning build only; together with production they are the kernels production had
    before the retirement (metadata unchanged but for the mark)."""
    retired = {n for n, k in mla_tuning_table.kernels.items() if k.shape.get("retired")}
    assert not retired & set(mla_table.kernels)
    for name in retired:
        assert not mla_tuning_table[name].shape.get("experimental") and not mla_tuning_table[name].shape.get("probe")
    assert len(retired) + len([k for k in mla_table.kernels.values() if k.family != "combine"]) == 48


def test_the_hooks_plan_with_the_runtimes_opt_in_and_no_kernel_choice(monkeypatch):
    """Runtime._mla asks PlanCache.mla for the served layout, the call's shape and the process's opt-in, nothing that
    picks a kernel: the choice is the launcher's."""
    asked = []

    class Plans:
        def mla(self, device, layout, rows, h, topk, **kw):
            asked.append((layout, rows, h, topk, kw))
            return lambda q, cache, indices, sm_scale: (torch.zeros(1), torch.zeros(1))

    for lossy in (False, True):
        rt = hooks.Runtime("pdserve", lossy_bf16_dequant=lossy)
        rt.plans = Plans()
        q = torch.zeros(3, 1, 16, 576, dtype=torch.bfloat16)
        rt._mla(None, None, {}, "fp8", q, torch.zeros(4, 64, 1, 656, dtype=torch.uint8),
                torch.zeros(3, 2048, dtype=torch.int32), 512, 0.1, bf16_kv=False, page=64)
        assert asked[-1] == ("v32", 3, 16, 2048, dict(bf16_kv=False, page=64, lossy_bf16_dequant=lossy))


@pytest.mark.parametrize("value,on", [(None, False), ("1", True), (" 1 ", True), ("0", False), ("true", False),
                                      ("", False)])
def test_the_lossy_opt_in_is_exactly_1_and_the_status_line_says_it(monkeypatch, value, on):
    plugin = importlib.import_module("pdserve_kernels.sglang_plugin")
    status = importlib.import_module("pdserve_kernels.sglang_plugin.status")
    if value is None:
        monkeypatch.delenv(plugin.ENV_LOSSY, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV_LOSSY, value)
    assert plugin.lossy_requested() is on
    line = status.Status(requested="pdserve", kernels={}, lossy_bf16_dequant=on).line()
    assert f'"lossy_bf16_dequant": {"true" if on else "false"}' in line


def test_a_plan_refused_on_sm120_falls_back_to_sglang_with_the_reason(monkeypatch, plugin_plans, mla_table):
    """V3.2 FP8 on sm_120 without the opt-in: the plan refuses (no exact kernel fits), the hook hands the call to
    SGLang's kernel and logs why, once."""
    plugin_plans[None] = _launcher(mla_table, (12, 0), SM120_SMEM)   # meta tensors: device index None
    rt = hooks.Runtime("pdserve")
    original = lambda backend, **kw: "sglang"  # noqa: E731
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16, device="meta")
    layer = types.SimpleNamespace(tp_q_head_num=16, head_dim=576, layer_id=0)
    backend = types.SimpleNamespace(real_page_size=64, kv_cache_dim=656)
    args = dict(q_all=q, kv_cache=torch.zeros(64, 1, 656, dtype=torch.uint8, device="meta"), v_head_dim=512,
                sm_scale=0.1, layer=layer, metadata=None,
                page_table_1=torch.zeros(2, 2048, dtype=torch.int32, device="meta"))
    monkeypatch.setattr(rt, "serves", lambda op, device: True)
    assert rt.forward_decode(lambda: rt.mla_fp8(original, backend, **args)) == "sglang"
    assert any(op == "sparse_mla_decode" and "no V3.2 FP8 kernel exact" in reason for op, reason in rt.fallbacks.seen())


def test_two_sources_paged_differently_reach_the_kernel_each_with_its_page(mla_table):
    """SGLang's V4 decode: the window cache at page 256 as kv, the C4 cache at page 64 (or C128 at 2) as extra_kv, in
    one launch whose parameters carry each source's page and block stride (MlaParams.page_shift_extra)."""
    launches = []

    class Module(_Occupancy):
        def launch(self, name, grid, threads, smem, stream, params, programmatic=False):
            launches.append((name, params))

    class Torch:   # torch, with a current stream on this CPU machine
        cuda = types.SimpleNamespace(current_stream=lambda device: types.SimpleNamespace(cuda_stream=0))

        def __getattr__(self, name):
            return getattr(torch, name)

    mla = _launcher(mla_table)
    mla.module, mla.torch = Module(), Torch()
    mla._counters = lambda n: torch.zeros(max(n, 1), dtype=torch.int32)
    for extra_page, extra in ((64, 512), (2, 128)):
        window = torch.zeros(4, 256 * 584 + 256, dtype=torch.uint8)[:, :256 * 584].view(4, 256, 1, 584)
        compressed = torch.zeros(9, extra_page * 584 + 64, dtype=torch.uint8)[:, :extra_page * 584]
        compressed = compressed.view(9, extra_page, 1, 584)
        launches.clear()
        mla(torch.zeros(2, 1, 64, 512, dtype=torch.bfloat16), window, torch.zeros(2, 1, 128, dtype=torch.int32),
            512 ** -0.5, layout="v4", sinks=torch.zeros(64), extra_kv=compressed,
            extra_indices=torch.zeros(2, 1, extra, dtype=torch.int32))
        main = [p for name, p in launches if "combine" not in name]
        assert len(main) == 1   # one launch over both sources (plus the combine when the plan splits)
        p = main[0]
        assert (p.page_shift, p.page_shift_extra) == (8, extra_page.bit_length() - 1)
        assert (p.block_stride, p.block_stride_extra) == (256 * 584 + 256, extra_page * 584 + 64)
        assert (p.num_entries, p.num_entries_extra, p.topk, p.topk_extra) == (4 * 256, 9 * extra_page, 128, extra)
