"""CPU-only: the metadata the build emits (kernels/kernel_metadata.cpp, from the headers the kernels are
instantiated from) against what the launchers use: the ctypes parameter structs' layout, the kernel names
the launchers can ask for, the constants of the input contract, and no wrong-by-design probe in production."""

import ctypes
import importlib
import itertools

import pytest

mla_mod = importlib.import_module("pdserve_kernels.sparse_mla_decode")   # the package re-exports functions
dsa_mod = importlib.import_module("pdserve_kernels.dsa_indexer")

HOPPER_SMEM = 232448


@pytest.fixture(scope="module")
def dsa_table(metadata_dir):
    return dsa_mod.load_kernel_table(metadata_dir / "dsa_indexer.fatbin")


@pytest.mark.parametrize("module", ["sparse_mla_decode", "dsa_indexer"])
def test_ctypes_params_have_the_built_layout(metadata_dir, module):
    mod = mla_mod if module == "sparse_mla_decode" else dsa_mod
    table = mod.load_kernel_table(metadata_dir / f"{module}.fatbin")
    mirror = [(name, getattr(mod._Params, name).offset, getattr(mod._Params, name).size)
              for name, *_ in mod._Params._fields_]
    assert mirror == list(table.params_fields)
    assert ctypes.sizeof(mod._Params) == table.params_size
    table.check_params(mod._Params)   # what the launcher runs at load


def test_a_drifted_mirror_is_refused(mla_table):
    # Two adjacent int fields swapped: same size, so only the field-by-field check can see it.
    fields = list(mla_mod._Params._fields_)
    i = [n for n, _ in fields].index("topk")
    fields[i], fields[i + 1] = fields[i + 1], fields[i]
    drifted = type("Drifted", (ctypes.Structure,), {"_fields_": fields})
    with pytest.raises(RuntimeError, match="first difference"):
        mla_table.check_params(drifted)


def test_dsa_constants_are_the_launchers(dsa_table):
    assert dsa_table.constants == dsa_mod.CONSTANTS
    names = {f"dsa_{kind}_{impl}_n{nn}" for kind, impl, nn in
             itertools.product(("score", "fused", "score_early"), ("wgmma", "mma"), (1, 2))}
    assert set(dsa_table.kernels) == names | {"dsa_select", "dsa_select_early", "dsa_select_cluster"}
    for name in names:
        assert dsa_table[name].threads == 128 and dsa_table[name].shape["next_n"] == int(name[-1])
    # the fused path's largest chunk still fits a Hopper SM's shared memory at next_n = 2
    assert dsa_table["dsa_fused_wgmma_n2"].smem_bytes(dsa_mod.FUSED_MAX_CHUNK_PAGES) <= HOPPER_SMEM


def test_production_fatbin_has_no_probe_kernels(mla_table, mla_tuning_table, metadata_dir, tuning_metadata_dir):
    assert not [n for n, k in mla_table.kernels.items() if k.shape.get("probe")]
    assert not [n for n in mla_table.kernels if n.endswith(("_x1", "_x2", "_x3", "_o1", "_og", "_od", "_w16", "_tl"))]
    # the indexer's tuning build is the production kernels with timeline stamps: the same table
    assert (tuning_metadata_dir / "dsa_indexer_tuning.json").read_text() == (metadata_dir /
                                                                             "dsa_indexer.json").read_text()
    tuning = mla_tuning_table
    probes = {n for n, k in tuning.kernels.items() if k.shape.get("probe")}
    assert probes == {"sparse_mla_wg_v32_s3_x1", "sparse_mla_wg_v32_s3_x2", "sparse_mla_wg_v32_s3_x3",
                      *(f"sparse_mla_wg_v32_t64_x{b}" for b in (1, 2, 4, 5)), "sparse_mla_wg_v32_t64q_x2",
                      "sparse_mla_wg_v32_t64c_x2", *(f"sparse_mla_wg_v32_t64xs_x{b}" for b in (1, 2, 4)),
                      "sparse_mla_wg_v4_t64x_tl", "sparse_mla_wg_v32_t64x_tl"}
    # experimental kernels (correct, not measured faster than what they would replace) are tuning-only too
    experimental = {n for n, k in tuning.kernels.items() if k.shape.get("experimental")} - probes
    wgt = {f"sparse_mla_wg_{lay}_{v}" for lay in ("v4", "v32") for v in
           ("t64", "t64q", "t64p", "t64c", "t64xs", "t64xb")} - {"sparse_mla_wg_v32_t64c"}   # that one is production
    es = {f"sparse_mla_es_{lay}_h16_t64_s2" for lay in ("v4", "v32")}
    gather = {f"sparse_mla_{lay}_h16_t64_o1" for lay in ("v4", "v32")}   # first version, per-warp fp8 gather
    w16 = {f"sparse_mla_{lay}_h16_t64_w16" for lay in ("v4", "v32", "v4b", "v32b")}   # first version, 16 warps
    timelines = {"sparse_mla_v4_h16_t64_tl", "sparse_mla_v4b_h16_t64_tl", "sparse_mla_combine_tl",
                 "sparse_mla_combine_b8_tl"}   # stamps into the counters pointer, results unchanged
    assert experimental == wgt | es | gather | w16 | timelines
    assert not [n for n, k in mla_table.kernels.items() if k.shape.get("experimental")]
    # retired kernels (issue 38 item 3: no shape's choice in the launcher's table) are tuning-only, and nothing else
    retired = {n for n, k in tuning.kernels.items() if k.shape.get("retired")}
    assert retired == RETIRED and not retired & (probes | experimental)
    assert not [n for n, k in mla_table.kernels.items() if k.shape.get("retired")]
    assert set(tuning.kernels) - probes - experimental - retired == set(mla_table.kernels)
    for name in wgt:   # no index list in shared memory: the same bytes at every split length
        assert tuning[name].smem_bytes(2048) == tuning[name].smem_bytes(64) <= HOPPER_SMEM
    # two V4 es CTAs per SM (228 KB, 1 KB reserved per CTA) at V4 CSA's B=64 split of 192 entries
    assert 2 * (tuning["sparse_mla_es_v4_h16_t64_s2"].smem_bytes(192) + 1024) <= 228 * 1024


# Retired from production (issue 38 item 3): the launcher's one table chooses them for no shape, or for none a plugin
# call has (test_exact_default.py checks that every kernel left is chosen for a plugin call).
RETIRED = {
    "sparse_mla_v32_h16_t64", "sparse_mla_v32_h64_t32", "sparse_mla_ds_v4_h32_t64_s2",
    *(f"sparse_mla_ds_{lay}_{shape}" for lay in ("v4", "v32")
      for shape in ("h16_t64_s3", "h32_t64_s3", "h16_t64_s3_c4", "h32_t64_s3_c4", "h16_t32_s4_c4")),
    "sparse_mla_wg_v32_s3", "sparse_mla_wg_v4_s3_h", "sparse_mla_wg_v32_s3_h", "sparse_mla_wg_v4_s3_c2",
    "sparse_mla_wg_v32_s3_c2_m", "sparse_mla_wg_v32_s3_e_c2",
    # V4's bf16-KV kernels: the launcher's choice for bf16 V4 KV, which no plugin call has (SGLang's V4 cache is FP8)
    *(f"sparse_mla_v4b_{shape}" for shape in ("h16_t64", "h32_t64", "h64_t64", "h16_t32")),
}


def _launcher(table, smem_limit=HOPPER_SMEM, num_sms=132, capability=(9, 0)):
    # pick_kernel and plan's shared-memory part need only these fields; no GPU here.
    obj = object.__new__(mla_mod.SparseMlaDecode)
    obj.smem_limit, obj.num_sms, obj.capability, obj.kernels = smem_limit, num_sms, capability, table
    return obj


def test_every_kernel_the_launcher_picks_is_in_the_fatbin(mla_table, mla_tuning_table):
    """Over layouts, head counts, row counts, variants and GPUs: the name pick_kernel builds exists, has the
    layout asked for, covers the heads as the launcher plans them, and fits the GPU's shared memory with the
    largest index list of its layout (V4 HCA: 1024 + 128 window entries; V3.2: top-2048). The variants that force a
    family ("": the first version, "ds", "wgh": the f16 tile) may name a retired one, in the tuning build only; a
    tuning-only layout (V4's bf16 KV) is picked from the tuning build's table."""
    picked = set()
    for layout in ("v4", "v32", "v4_bf16", "v32_bf16"):
        table = mla_tuning_table if layout in mla_mod.TUNING_ONLY_LAYOUTS else mla_table
        # the GPUs the fatbin has cubins for (sm_90a, sm_120a: build.sh); it loads on no other
        gpus = [_launcher(table), _launcher(table, smem_limit=101376, capability=(12, 0))]
        for gpu, h, rows, variant, entries, lossy in itertools.product(
                gpus, (1, 8, 16, 24, 32, 48, 64, 96, 128), (None, 1, 8, 63, 64, 128, 1024),
                (None, "auto", "", "ds", "wg", "wgh", "wge"), (None, 640, 2048), (False, True)):
            name = gpu.pick_kernel(layout, h, variant=variant, rows=rows, entries=entries, lossy_bf16_dequant=lossy)
            if table is mla_table and variant in ("", "ds", "wgh") and name in RETIRED:
                continue
            assert name in table, (layout, h, rows, variant, name)
            info = table[name]
            assert mla_mod.kernel_shape(info)[0] == layout, name
            if info.family == "wg":
                assert gpu.capability[0] == 9, name
            ntot = 1152 if layout.startswith("v4") else 2048
            per_split = min(ntot, -(-ntot // info.shape["tile"]) * info.shape["tile"])
            while info.smem_bytes(per_split) > gpu.smem_limit and per_split > info.shape["tile"]:
                per_split -= info.shape["tile"]   # what plan() does: more splits until a split fits
            assert info.smem_bytes(per_split) <= gpu.smem_limit, (name, gpu.smem_limit)
            picked.add(name)
    # the default and the named variants reach every family of the fatbin
    assert {mla_tuning_table[n].family for n in picked} == {"mla", "ds", "wg"}


def test_ds_and_wg_kernels_fit_hopper_at_the_largest_index_list(mla_table):
    for name, info in mla_table.kernels.items():
        if info.family in ("ds", "wg"):
            topk = 2048 if info.shape["layout"] == "v32" else 1152
            assert info.smem_bytes(topk) <= HOPPER_SMEM, name
