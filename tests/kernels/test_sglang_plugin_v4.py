"""The SGLang plugin's DeepSeek V4 hooks on CPU (issue 38 item 1).

Every V4 target and the parameters its hook names are checked against the sources of BOTH SGLang versions the plugin
serves: the installed 0.5.23 (the pinned one) and 0.5.17 (the GPU tier's). 0.5.17's Python files (sglang 0.5.17 and
sglang-kernel 0.4.5, FlashMLA's Python side) are read from $PDSERVE_SGLANG_0517_SRC, default .venv/sglang-0.5.17: the
two wheels, or the tree of their .py files and dist-info that .ci/setup unpacks there. Without them these tests skip,
unless PDSERVE_REQUIRE_SGLANG_0517=1. Nothing of 0.5.17 is imported: its files are parsed (ast), as the V3.2 tests
parse the installed SGLang.

Then the decisions, the fallbacks (each with its reason, logged once) and the indexer's placeholder scores and in-place
top-k, on CPU tensors. The kernels themselves run in the GPU tier (tests/kernels/test_sglang_plugin_gpu.py).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import logging
import os
import pathlib
import types
import zipfile

import pytest

from pdserve_kernels.sglang_plugin import decide as decision
from pdserve_kernels.sglang_plugin import status as st
from pdserve_kernels.sglang_plugin import v4_hooks

REPO = pathlib.Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch")


# ---- the two SGLang versions' sources ----

class Sources:
    """Python source files of one SGLang version by module name (sglang, sgl_kernel)."""

    def __init__(self, version: str, read) -> None:
        self.version, self._read = version, read

    def text(self, module: str) -> str:
        found = self._read(module.replace(".", "/") + ".py")
        if found is None:
            found = self._read(module.replace(".", "/") + "/__init__.py")
        assert found is not None, f"{module} is not in SGLang {self.version}'s sources"
        return found

    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.text(module))


def _installed() -> Sources:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    site = pathlib.Path(next(iter(spec.submodule_search_locations))).parent
    from importlib import metadata

    version = metadata.version("sglang")

    def read(rel: str):
        path = site / rel
        return path.read_text() if path.is_file() else None

    return Sources(version, read)


def _sources_0517() -> Sources:
    where = pathlib.Path(os.environ.get("PDSERVE_SGLANG_0517_SRC", REPO / ".venv" / "sglang-0.5.17"))
    wheels = sorted(where.glob("sglang-0.5.17-*.whl")) + sorted(where.glob("sglang_kernel-0.4.5-*.whl"))
    tree = (where / "sgl_kernel" / "flash_mla.py").is_file()
    if len(wheels) != 2 and not tree:
        reason = (f"neither the sglang 0.5.17 + sglang-kernel 0.4.5 wheels nor their sources are in {where} "
                  "(.ci/setup unpacks them there)")
        if os.environ.get("PDSERVE_REQUIRE_SGLANG_0517") == "1":
            pytest.fail(f"{reason}, but PDSERVE_REQUIRE_SGLANG_0517=1 demands these tests")
        pytest.skip(reason)
    if tree:
        def read(rel: str):
            path = where / rel
            return path.read_text() if path.is_file() else None
    else:
        archives = [zipfile.ZipFile(w) for w in wheels]

        def read(rel: str):
            for z in archives:
                if rel in z.NameToInfo:
                    return z.read(rel).decode()
            return None

    metadata = read("sglang-0.5.17.dist-info/METADATA") or ""
    assert "\nVersion: 0.5.17\n" in metadata, f"{where} does not hold SGLang 0.5.17's dist-info"
    return Sources("0.5.17", read)


@pytest.fixture(scope="module", params=["0.5.17", "0.5.23"])
def sglang(request) -> Sources:
    if request.param == "0.5.17":
        return _sources_0517()
    found = _installed()
    if found.version != "0.5.23":
        pytest.skip(f"the installed sglang is {found.version}, not the pinned 0.5.23")
    return found


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _function(scope, name: str):
    for node in scope.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"{name} not found")


def _params(fn) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _hook_params(method) -> list[str]:
    """The hook's named parameters after `original` (the first stands for SGLang's self where SGLang's is a method)."""
    params = list(inspect.signature(method).parameters.values())[1:]
    return [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]


def _generation(sources: Sources) -> str:
    return sources.version if sources.version in v4_hooks.FLASH_MLA else "0.5.23"


V4_BACKEND = ("sglang.srt.layers.attention.deepseek_v4_backend", "DeepseekV4AttnBackend")


def test_the_installed_sglang_is_recognised_as_the_0523_layout():
    found = _installed()
    assert v4_hooks.sglang_generation() == ("0.5.23" if found.version >= "0.5.23" else "0.5.17")


def test_the_module_that_tells_the_versions_apart_is_in_0523_only(sglang):
    # v4_hooks.sglang_generation: 0.5.23 moved FlashMLA into this module
    found = sglang._read("sglang/kernels/ops/attention/flash_mla_interface.py") is not None
    assert found == (_generation(sglang) == "0.5.23")
    assert sglang._read("sglang/srt/layers/attention/deepseek_v4_backend.py") is not None


def test_the_backend_methods_the_hooks_wrap_take_what_the_hooks_name(sglang):
    rt = _runtime()
    backend = _class(sglang.tree(V4_BACKEND[0]), V4_BACKEND[1])
    init = _params(_function(backend, "__init__"))
    assert init[:2] == ["self", "model_runner"]
    forward = _params(_function(backend, "forward"))
    assert forward[:6] == ["self", *_hook_params(rt.v4.forward)[1:6]], forward
    mixin = _class(sglang.tree(v4_hooks.V4_INDEXER), "C4IndexerBackendMixin")
    # c4_indexer reads forward_batch as the fourth positional argument after self
    assert _params(_function(mixin, "forward_c4_indexer"))[:5] == ["self", "x", "q_lora", "c4_indexer",
                                                                   "forward_batch"]


def _calls_in(fn, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                found.append(node)
    return found


def test_flash_mla_is_the_function_the_v4_decode_calls_and_takes_every_keyword_it_is_given(sglang):
    gen = _generation(sglang)
    module, _, name = v4_hooks.FLASH_MLA[gen].rpartition(".")
    params = _params(_function(sglang.tree(module), name))
    read = {"q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink", "softmax_scale",
            "head_dim_v", "block_table", "cache_seqlens", "is_fp8_kvcache", "descale_q", "descale_k", "causal"}
    assert read <= set(params), read - set(params)
    # The call site: every argument by keyword (the hook refuses positional ones), names FlashMLA's.
    backend = _class(sglang.tree(V4_BACKEND[0]), V4_BACKEND[1])
    method = _function(backend, "forward" if gen == "0.5.17" else "_forward_attention")
    calls = list(_calls_in(method, "flash_mla_with_kvcache"))
    assert len(calls) == 1, f"{len(calls)} FlashMLA calls in {method.name}"
    (call,) = calls
    assert not call.args and {k.arg for k in call.keywords} <= set(params)
    assert {"q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink"} <= {
        k.arg for k in call.keywords}


def test_the_flash_mla_target_is_looked_up_where_the_patch_is_seen(sglang):
    backend = _class(sglang.tree(V4_BACKEND[0]), V4_BACKEND[1])
    if _generation(sglang) == "0.5.17":
        # imported inside forward, at call time, from the module the registry patches
        imports = [n for n in ast.walk(_function(backend, "forward")) if isinstance(n, ast.ImportFrom)]
        assert any(n.module == "sgl_kernel.flash_mla" and any(a.name == "flash_mla_with_kvcache" for a in n.names)
                   for n in imports)
    else:
        # bound in __init__ (after general plugins were applied) as an attribute of the patched module
        partials = list(_calls_in(_function(backend, "__init__"), "partial"))
        bound = [c.args[0] for c in partials if c.args and isinstance(c.args[0], ast.Attribute)]
        assert any(a.attr == "flash_mla_with_kvcache" and isinstance(a.value, ast.Name)
                   and a.value.id == "flash_mla_interface" for a in bound)
        imports = [n for n in ast.walk(_function(backend, "__init__")) if isinstance(n, ast.ImportFrom)]
        assert any(n.module == "sglang.kernels.ops.attention" and any(a.name == "flash_mla_interface"
                                                                      for a in n.names) for n in imports)


def test_the_sm120_decode_is_the_keyword_only_function_called_by_keyword_with_flashmlas_names(sglang):
    gen = _generation(sglang)
    module, _, name = v4_hooks.FLASH_MLA_SM120.rpartition(".")
    fn = _function(sglang.tree(module), name)
    assert not _params(fn) and fn.args.kwarg is not None   # def flash_mla_with_kvcache_sm120(**kwargs)
    backend = _class(sglang.tree(V4_BACKEND[0]), V4_BACKEND[1])
    method = _function(backend, "forward" if gen == "0.5.17" else "_forward_attention")
    (call,) = _calls_in(method, name)
    flashmla = set(_params(_function(sglang.tree(v4_hooks.FLASH_MLA[gen].rpartition(".")[0]),
                                     "flash_mla_with_kvcache")))
    assert not call.args and {k.arg for k in call.keywords} <= flashmla
    imports = [n for n in ast.walk(method) if isinstance(n, ast.ImportFrom) and n.module == module]
    assert any(a.name == name for n in imports for a in n.names)   # imported at call time: the patch is seen


def test_sglangs_torch_logits_take_deepgemms_eight_arguments(sglang):
    tree = sglang.tree(v4_hooks.V4_INDEXER)
    rt = _runtime()
    for target in v4_hooks.LOGITS_TORCH:
        fn = _function(tree, target.rpartition(".")[2])
        assert len(_params(fn)) == len(_hook_params(rt.v4.logits)) == 8
    method = _function(_class(tree, "C4IndexerBackendMixin"), "forward_c4_indexer")
    chosen = {ast.unparse(n.value) for n in ast.walk(method) if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "fn" for t in n.targets)}
    assert {"fp8_paged_mqa_logits_torch_sm120", "fp8_paged_mqa_logits_torch"} <= chosen


def test_the_indexer_calls_deepgemm_and_the_v2_top_k_the_way_the_hooks_take_them(sglang):
    gen = _generation(sglang)
    tree = sglang.tree(v4_hooks.V4_INDEXER)
    method = _function(_class(tree, "C4IndexerBackendMixin"), "forward_c4_indexer")
    imports = [n for n in ast.walk(method) if isinstance(n, ast.ImportFrom) and n.module == "deep_gemm"]
    assert any(a.name == "fp8_paged_mqa_logits" and a.asname == "fn" for n in imports for a in n.names)
    (logits,) = list(_calls_in(method, "fn"))
    # 8 positional arguments, as the hook names them (q, cache, weights, lens, table, schedule, max_len, clean)
    rt = _runtime()
    assert len(logits.args) == len(_hook_params(rt.v4.logits)) == 8 and not logits.keywords
    # The v2 top-k: a module-level name of the indexer module (imported from the kernels package), the parameters
    # the hook names, called there or in its helper.
    topk_name = v4_hooks.TOPK_V2[gen].rpartition(".")[2]
    assert any(isinstance(n, ast.ImportFrom) and any(a.name == topk_name for a in n.names) for n in tree.body)
    topk = _function(sglang.tree("sglang.kernels.ops.attention.dsv4.topk"), topk_name)
    assert _params(topk)[:6] == _hook_params(rt.v4.topk_v2)
    assert _params(topk)[6:] == ["out_raw_indices"]
    assert _calls_in(tree, topk_name), f"{topk_name} is not called in {v4_hooks.V4_INDEXER}"


@pytest.mark.parametrize("attribute, versions", [
    ("page_size", ("0.5.17", "0.5.23")),
    ("enable_deepseek_v4_fp4_indexer", ("0.5.17", "0.5.23")), ("dsa_topk_backend", ("0.5.17", "0.5.23")),
    ("is_dsv41", ("0.5.23",)), ("trtllm_attn", ("0.5.23",)), ("device", ("0.5.17", "0.5.23")),
    ("req_to_token", ("0.5.17", "0.5.23")),
])
def test_the_backend_attributes_the_status_reads_are_set_by_sglang(sglang, attribute, versions):
    if _generation(sglang) not in versions:
        pytest.skip(f"{attribute} is new in {versions}")
    sets = set()  # self.<name> = ... in a method, or <name> = ... in the class body (a class default)
    for module, cls in (V4_BACKEND, (v4_hooks.V4_INDEXER, "C4IndexerBackendMixin")):
        scope = _class(sglang.tree(module), cls)
        sets |= _self_attributes(scope)
        for node in scope.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            sets |= {t.id for t in targets if isinstance(t, ast.Name)}
    assert attribute in sets


V32_BACKEND = ("sglang.srt.layers.attention.dsa_backend", "DeepseekSparseAttnBackend")


def _self_attributes(scope) -> set[str]:
    """Every `self.<name>` a class's methods assign."""
    found = set()
    for node in ast.walk(scope):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        found |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id == "self"}
    return found


# What hooks.Runtime.on_backend and mla_fp8 read from V3.2's backend. The page size moved: 0.5.23 renamed
# real_page_size to physical_page_size (page_size // dsa_index_kpool); reading the old name there once turned
# every V3.2 op over to SGLang ("page size 0").
@pytest.mark.parametrize("attribute, versions", [
    ("real_page_size", ("0.5.17",)), ("physical_page_size", ("0.5.23",)), ("dsa_index_kpool", ("0.5.23",)),
    ("dsa_decode_impl", ("0.5.17", "0.5.23")), ("dsa_kv_cache_store_fp8", ("0.5.17", "0.5.23")),
    ("kv_cache_dim", ("0.5.17", "0.5.23")), ("use_fused_topk", ("0.5.17", "0.5.23")),
    ("dsa_index_topk", ("0.5.17", "0.5.23")), ("device", ("0.5.17", "0.5.23")),
    ("req_to_token", ("0.5.17", "0.5.23")),
])
def test_the_v32_backend_attributes_the_status_reads_are_set_by_sglang(sglang, attribute, versions):
    from pdserve_kernels.sglang_plugin.hooks import page_size

    attributes = _self_attributes(_class(sglang.tree(V32_BACKEND[0]), V32_BACKEND[1]))
    assert (attribute in attributes) == (_generation(sglang) in versions), (attribute, _generation(sglang))
    if attribute.endswith("page_size") and _generation(sglang) in versions:
        # the plugin's accessor finds this version's name
        assert page_size(types.SimpleNamespace(**{attribute: 64})) == 64


def test_the_c4_indexer_takes_its_top_k_from_the_config_the_status_reads(sglang):
    init = _function(_class(sglang.tree(v4_hooks.V4_INDEXER), "C4Indexer"), "__init__")
    assigned = [n for n in ast.walk(init) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == "index_topk" for t in n.targets)]
    assert [ast.unparse(n.value) for n in assigned] == ["config.index_topk"]
    backend = _class(sglang.tree(V4_BACKEND[0]), V4_BACKEND[1])
    assert "hf_text_config" in ast.unparse(_function(backend, "__init__"))


def test_the_topk_backend_answers_what_the_status_asks(sglang):
    tree = sglang.tree("sglang.srt.layers.attention.dsa.dsa_topk_backend")
    methods = {f.name for f in _class(tree, "DSATopKBackend").body if isinstance(f, ast.FunctionDef)}
    assert {"is_torch", "is_flashinfer"} <= methods
    if _generation(sglang) == "0.5.23":
        assert "should_use_topk_v2" in methods


# ---- registration ----

@pytest.mark.parametrize("generation", ["0.5.17", "0.5.23"])
def test_serving_wraps_the_v4_decode_path_of_each_layout(generation):
    found = v4_hooks.targets(generation, serving=True)
    indexer = v4_hooks.V4_INDEXER
    assert found == {
        f"{v4_hooks.V4_BACKEND}.__init__": "v4.backend_init", f"{v4_hooks.V4_BACKEND}.forward": "v4.forward",
        v4_hooks.FLASH_MLA[generation]: "v4.flash_mla",
        "sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120": "v4.flash_mla_sm120",
        f"{indexer}.C4IndexerBackendMixin.forward_c4_indexer": "v4.c4_indexer",
        "deep_gemm.fp8_paged_mqa_logits": "v4.logits", f"{indexer}.fp8_paged_mqa_logits_torch_sm120": "v4.logits",
        f"{indexer}.fp8_paged_mqa_logits_torch": "v4.logits", v4_hooks.TOPK_V2[generation]: "v4.topk_v2"}
    assert v4_hooks.targets(generation, serving=False) == {f"{v4_hooks.V4_BACKEND}.__init__": "v4.backend_init"}
    # no DeepGEMM installed: its logits are not wrapped (the registry would log a failed import)
    assert set(found) - set(v4_hooks.targets(generation, serving=True, deep_gemm=False)) == {
        "deep_gemm.fp8_paged_mqa_logits"}
    assert v4_hooks.targets(None, serving=True) == {}


def test_every_target_resolves_to_a_hook_of_the_runtime(monkeypatch):
    import operator

    import pdserve_kernels.sglang_plugin as plugin

    rt = _runtime()
    for generation in ("0.5.17", "0.5.23"):
        for method in plugin.all_targets("pdserve", generation).values():
            assert callable(operator.attrgetter(method)(rt))


# ---- decisions ----

def v4_facts(**kw):
    base = dict(capability=(9, 0), page_size=256, index_topk=512)
    base.update(kw)
    return decision.V4Facts(**base)


@pytest.mark.parametrize("capability", [(9, 0), (12, 0)])
def test_the_reference_v4_setup_is_served_by_both_kernels(capability):
    # sm_120 too: the reference deployment's GPUs, where SGLang calls its own SM120 kernel (hooked as well)
    assert decision.decide_v4(v4_facts(capability=capability)) == (
        {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}, {})


@pytest.mark.parametrize("change, ops, words", [
    (dict(capability=(10, 0)), {"indexer_topk", "sparse_mla_decode"}, "sm_100"),
    (dict(page_size=64), {"indexer_topk", "sparse_mla_decode"}, "page size 64"),
    (dict(modules_error="OSError: no fatbin"), {"indexer_topk", "sparse_mla_decode"}, "no fatbin"),
    (dict(v41=True), {"indexer_topk", "sparse_mla_decode"}, "V4.1"),
    (dict(trtllm=True), {"indexer_topk", "sparse_mla_decode"}, "trtllm"),
    (dict(fp4_indexer=True), {"indexer_topk"}, "FP4 indexer"),
    (dict(index_topk=2048), {"indexer_topk"}, "index_topk 2048"),
])
def test_what_the_v4_hooks_do_not_cover_stays_with_sglang_and_says_why(change, ops, words):
    kernels, reasons = decision.decide_v4(v4_facts(**change))
    assert {op for op, k in kernels.items() if k == "sglang"} == ops
    assert set(reasons) == ops and all(words in reasons[op] for op in ops)


def test_a_v4_status_line_is_read_by_pdserve_verify_and_passes():
    from pdserve.probes import kernel_log
    from pdserve.probes.systemctl import UnitState
    from pdserve.verify.checks.kernels import KernelsAsked, check_kernels

    kernels, reasons = decision.decide_v4(v4_facts())
    lines = [st.Status(requested="pdserve", kernels=kernels, reasons=reasons, tp_rank=r, device=f"cuda:{r}", sm="9.0",
                       sglang="0.5.17", pdserve_kernels="0.1.0", model="deepseek_v4").line() for r in range(2)]
    state = UnitState("sglang-dsv4-decode.service", load_state="loaded", active_state="active", sub_state="running",
                      invocation_id="x")
    asked = KernelsAsked("decode", "sglang-dsv4-decode", "pdserve", 2)
    result = check_kernels(asked, state, kernel_log.parse(lines))
    assert result.status == "pass" and all("deepseek_v4" in d for d in result.details[:2])
    kernels, reasons = decision.decide_v4(v4_facts(fp4_indexer=True))
    off = st.Status(requested="pdserve", kernels=kernels, reasons=reasons, tp_rank=1, model="deepseek_v4").line()
    result = check_kernels(asked, state, kernel_log.parse([lines[0], off]))
    assert result.status == "fail" and "FP4 indexer" in result.observed


# ---- the hooks' fallbacks (CPU tensors: SGLang's original takes every call pdserve does not serve) ----

class _Mode:
    def __init__(self, decode: bool) -> None:
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


def _runtime(serving: bool = True):
    from pdserve_kernels.sglang_plugin.hooks import Runtime

    rt = Runtime("pdserve")
    if serving:
        rt.v4.kernels[None] = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}  # CPU tensors: index None
    return rt


def flash_mla_kwargs(B=2, h=64, window=128, extra=512, extra_page=64, **change):
    kw = dict(q=torch.zeros(B, 1, h, 512, dtype=torch.bfloat16),
              k_cache=torch.zeros(4, 256, 1, 584, dtype=torch.uint8).view(torch.float8_e4m3fn),
              head_dim_v=512, block_table=None, cache_seqlens=None, tile_scheduler_metadata=object(),
              softmax_scale=512 ** -0.5, is_fp8_kvcache=True, indices=torch.full((B, 1, window), -1, dtype=torch.int32),
              topk_length=torch.ones(B, dtype=torch.int32), attn_sink=torch.zeros(h),
              extra_k_cache=torch.zeros(8, extra_page, 1, 584, dtype=torch.uint8).view(torch.float8_e4m3fn),
              extra_indices_in_kvcache=torch.full((B, 1, extra), -1, dtype=torch.int32),
              extra_topk_length=torch.ones(B, dtype=torch.int32))
    kw.update(change)
    return kw


def _decode_step(rt, *, decode=True, heads=64, args=(), **kw):
    """SGLang's forward on a decode (or other) batch, calling FlashMLA inside; returns what FlashMLA's call gave."""
    calls = []

    def flashmla(*a, **k):
        calls.append((a, k))
        return "flashmla", None

    def forward(backend, q, k, v, layer, forward_batch, compress_ratio, **more):
        return rt.v4.flash_mla(flashmla, *args, **kw)[0]

    layer = types.SimpleNamespace(tp_q_head_num=heads, layer_id=3)
    batch = types.SimpleNamespace(forward_mode=_Mode(decode))
    out = rt.v4.forward(forward, object(), kw.get("q"), None, None, layer, batch, 4)
    return out, calls


def test_flash_mla_outside_a_decode_step_or_outside_forward_is_sglangs_and_silent():
    rt = _runtime()
    out, calls = _decode_step(rt, decode=False, **flash_mla_kwargs())
    assert out == "flashmla" and len(calls) == 1 and not rt.fallbacks.seen()
    # the V3.2 backend (or anything else) calling the same function outside DeepseekV4AttnBackend.forward
    assert rt.v4.flash_mla(lambda **k: ("flashmla", None), **flash_mla_kwargs())[0] == "flashmla"
    # not serving (the status decided SGLang's)
    out, _ = _decode_step(_runtime(serving=False), **flash_mla_kwargs())
    assert out == "flashmla"


@pytest.mark.parametrize("kw, words", [
    (dict(heads=65), "65 heads do not fit q's 64"),
    (dict(args=(1,)), "positional arguments"),
    (dict(is_fp8_kvcache=False), "only V4's FP8 layout"),
    (dict(kv_format="v41_fp8"), "'v41_fp8'"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int32)), "dense"),
    (dict(head_dim_v=448), "head_dim_v 448"),
    (dict(q=torch.zeros(2, 2, 64, 512, dtype=torch.bfloat16)), "[B, 1, h, 512]"),
    (dict(k_cache=torch.zeros(4, 256, 1, 656, dtype=torch.uint8)), "k_cache of shape (4, 256, 1, 656)"),
    (dict(extra_indices_in_kvcache=None), "without extra_indices"),
    (dict(attn_sink=torch.zeros(64, dtype=torch.bfloat16)), "attn_sink"),
    (dict(descale_q=torch.ones(1)), "descale"),
])
def test_flash_mla_calls_the_kernel_does_not_take_fall_back_with_their_reason(kw, words):
    rt = _runtime()
    heads, args = kw.pop("heads", 64), kw.pop("args", ())
    out, calls = _decode_step(rt, heads=heads, args=args, **flash_mla_kwargs(**kw))
    assert out == "flashmla" and len(calls) == 1
    ((op, reason),) = rt.fallbacks.seen()
    assert op == "sparse_mla_decode" and words in reason, reason


def test_a_q_the_hook_refuses_at_every_batch_size_is_one_fallback_line(caplog):
    rt = _runtime()
    with caplog.at_level(logging.INFO, logger="pdserve_kernels"):
        for B in (1, 2, 3, 8):
            _decode_step(rt, **flash_mla_kwargs(B=B, q=torch.zeros(B, 1, 64, 512, dtype=torch.float16)))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(st.FALLBACK_PREFIX)]
    assert len(lines) == 1 and "[B, 1, 64, 512]" in lines[0], lines


def test_a_fallback_reason_is_logged_once_however_often_it_recurs(caplog):
    rt = _runtime()
    with caplog.at_level(logging.INFO, logger="pdserve_kernels"):
        for B in (1, 2, 4, 2):
            _decode_step(rt, heads=65, **flash_mla_kwargs(B=B))
        _decode_step(rt, **flash_mla_kwargs(head_dim_v=448))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(st.FALLBACK_PREFIX)]
    assert len(lines) == 2
    assert "65 heads" in json.loads(lines[0][len(st.FALLBACK_PREFIX):])["reason"]


class _PlanStandIn:
    """Stands in for ops.SparseMlaPlan (no GPU here): records what the hook asks and hands back outputs shaped as the
    op's ([B, 1, h, 512] bf16, lse [B, 1, h]), out = q's first 512 dims so the test can see which heads went where."""

    def __init__(self) -> None:
        self.asked, self.calls = [], []

    def plan(self, device, layout, rows, h, topk, **kw):
        self.asked.append(dict(layout=layout, rows=rows, h=h, topk=topk, **kw))
        return self

    def __call__(self, q, kv, indices, sm_scale, *, sinks=None, extra_kv=None, extra_indices=None):
        self.calls.append(dict(q=q, kv=kv, indices=indices, sm_scale=sm_scale, sinks=sinks, extra_kv=extra_kv,
                               extra_indices=extra_indices))
        return q.clone(), torch.zeros(q.shape[:3])


@pytest.mark.parametrize("heads, extra_page, extra", [(64, 64, 512), (16, 64, 512), (16, 2, 128), (8, None, 0)])
def test_a_decode_call_runs_the_real_heads_over_both_caches_in_one_plan(monkeypatch, heads, extra_page, extra):
    rt = _runtime()
    stand_in = _PlanStandIn()
    monkeypatch.setattr(rt.plans, "mla", stand_in.plan)
    kw = flash_mla_kwargs(B=3, h=64, extra=max(extra, 64), extra_page=extra_page or 64)
    kw["q"] = torch.randn(3, 1, 64, 512).to(torch.bfloat16)
    kw["attn_sink"] = torch.arange(64, dtype=torch.float32)
    if not extra:
        kw.update(extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None)
    out, calls = _decode_step(rt, heads=heads, **kw)
    assert not calls and not rt.fallbacks.seen()  # FlashMLA was not called
    (asked,) = stand_in.asked
    assert asked == dict(layout="v4", rows=3, h=heads, topk=128, topk_extra=extra and max(extra, 64), bf16_kv=False,
                         page=min(256, extra_page or 256))
    (call,) = stand_in.calls
    assert call["q"].is_contiguous() and torch.equal(call["q"], kw["q"][:, :, :heads])
    assert torch.equal(call["sinks"], torch.arange(heads, dtype=torch.float32))
    assert call["sm_scale"] == 512 ** -0.5 and call["kv"] is kw["k_cache"] and call["indices"] is kw["indices"]
    assert call["extra_kv"] is kw["extra_k_cache"] and call["extra_indices"] is kw["extra_indices_in_kvcache"]
    # FlashMLA's shape back (the padded heads SGLang drops are unwritten); the real heads are the kernel's
    assert out.shape == (3, 1, 64, 512) and torch.equal(out[:, :, :heads], kw["q"][:, :, :heads])


def test_the_sm120_entry_is_served_the_same_and_falls_back_with_its_own_arguments(monkeypatch):
    rt = _runtime()
    stand_in = _PlanStandIn()
    monkeypatch.setattr(rt.plans, "mla", stand_in.plan)
    kw = flash_mla_kwargs(B=2, h=64)
    for name in ("block_table", "cache_seqlens", "tile_scheduler_metadata", "is_fp8_kvcache"):
        kw.pop(name)   # SGLang's SM120 call passes none of these
    layer = types.SimpleNamespace(tp_q_head_num=16, layer_id=0)
    batch = types.SimpleNamespace(forward_mode=_Mode(True))
    fail = lambda **k: pytest.fail("SGLang's SM120 kernel was called")  # noqa: E731
    out = rt.v4.forward(lambda *a, **k: rt.v4.flash_mla_sm120(fail, **kw)[0], object(), kw["q"], None, None, layer,
                        batch, 4)
    assert out.shape == (2, 1, 64, 512) and stand_in.asked[0]["h"] == 16
    seen = []
    rt.v4.forward(lambda *a, **k: rt.v4.flash_mla_sm120(lambda **k: seen.append(k) or ("sm120", None),
                                                        **{**kw, "head_dim_v": 448})[0], object(), kw["q"], None,
                  None, layer, batch, 4)
    assert seen == [{**kw, "head_dim_v": 448}]   # SGLang's kernel gets exactly its own arguments back


def _logits_call(rt, *, decode=True, serving_indexer=True, **change):
    calls = []

    def deepgemm(*args):
        calls.append(args)
        return "deepgemm logits"

    B = 2
    args = dict(q=torch.zeros(B, 1, 64, 128, dtype=torch.float8_e4m3fn),
                kv_cache=torch.zeros(16, 64, 1, 132, dtype=torch.uint8), weights=torch.zeros(B, 64),
                context_lens=torch.ones(B, 1, dtype=torch.int32), block_table=torch.zeros(B, 4, dtype=torch.int32),
                schedule=torch.zeros(133, 2, dtype=torch.int32), max_context_len=256, clean_logits=False)
    args.update(change)
    backend = types.SimpleNamespace(device=torch.device("cpu"), c4_topk=512)
    if not serving_indexer:
        rt.v4.kernels[None]["indexer_topk"] = "sglang"
    result = {}

    def forward_c4_indexer(backend, x, q_lora, c4_indexer, forward_batch, **more):
        result["logits"] = rt.v4.logits(deepgemm, *args.values())

    rt.v4.c4_indexer(forward_c4_indexer, backend, None, None, None,
                     types.SimpleNamespace(forward_mode=_Mode(decode)))
    return result["logits"], calls


def test_indexer_logits_outside_a_v4_decode_indexer_call_are_deepgemms():
    rt = _runtime()
    assert _logits_call(rt, decode=False)[0] == "deepgemm logits"
    assert _logits_call(rt, serving_indexer=False)[0] == "deepgemm logits"
    # V3.2's indexer (or anything else) calling DeepGEMM outside forward_c4_indexer
    assert rt.v4.logits(lambda *a: "deepgemm logits", *range(8)) == "deepgemm logits"
    assert not rt.fallbacks.seen()


def test_the_indexer_is_served_when_the_backend_device_has_no_index(monkeypatch):
    # SGLang's V4 backend keeps torch.device(model_runner.device): plain "cuda", no index, while on_backend keyed the
    # kernel table by the current device's index. The GPU tier's first V4 comparison (2026-12-06) found the indexer
    # never served for exactly that: the lookup used index None.
    rt = _runtime()
    rt.v4.kernels[0] = rt.v4.kernels.pop(None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    marked = []

    def forward_c4_indexer(backend, x, q_lora, c4_indexer, forward_batch, **more):
        marked.append(rt.v4._local.indexer)

    batch = types.SimpleNamespace(forward_mode=_Mode(True))
    rt.v4.c4_indexer(forward_c4_indexer, types.SimpleNamespace(device=torch.device("cuda")), x=None, q_lora=None,
                     c4_indexer=None, forward_batch=batch)
    assert marked[0] is not None  # the call is pdserve's (before the fix: None, SGLang's logits and top-k ran)
    # The input's device decides when there is one: a CPU input is looked up under CPU's index (None), not served.
    rt.v4.c4_indexer(forward_c4_indexer, types.SimpleNamespace(device=torch.device("cuda")), x=torch.zeros(1),
                     q_lora=None, c4_indexer=None, forward_batch=batch)
    assert marked[1] is None


@pytest.mark.parametrize("change, words", [
    (dict(q=torch.zeros(2, 1, 64, 128, dtype=torch.bfloat16)), "not FP8"),
    (dict(q=torch.zeros(2, 2, 64, 128, dtype=torch.float8_e4m3fn)), "[B, 1, 64, 128]"),
    (dict(kv_cache=torch.zeros(16, 64, 1, 68, dtype=torch.uint8)), "index cache of shape"),
    (dict(context_lens=torch.ones(2, 2, dtype=torch.int32)), "per-token lengths"),
])
def test_indexer_calls_the_kernel_does_not_take_fall_back_with_their_reason(change, words):
    rt = _runtime()
    logits, calls = _logits_call(rt, **change)
    assert logits == "deepgemm logits" and len(calls) == 1
    ((op, reason),) = rt.fallbacks.seen()
    assert op == "indexer_topk" and words in reason


# ---- the indexer's picks, handed to SGLang ----

def test_placeholder_scores_make_any_exact_top_k_pick_exactly_pdserves_positions():
    g = torch.Generator().manual_seed(11)
    rows, width, topk = 6, 2112, 512
    lengths = torch.tensor([1, 300, 512, 513, 1500, 2112])
    positions = torch.full((rows, topk), -1, dtype=torch.int32)
    for r, n in enumerate(lengths.tolist()):
        picks = torch.randperm(n, generator=g)[:min(n, topk)]
        positions[r, :picks.numel()] = picks.int()
    scores = v4_hooks.placeholder_scores(positions, width)
    assert scores.shape == (rows, width) and scores.stride(0) % 4 == 0 and scores.stride(1) == 1
    for r, n in enumerate(lengths.tolist()):
        k = min(n, topk)
        chosen = torch.topk(scores[r, :n], k).indices  # SGLang's torch top-k: the row masked to its length
        assert set(chosen.tolist()) == set(positions[r][positions[r] >= 0].tolist())
        assert torch.isfinite(scores[r, :n]).sum() == k


def test_the_v2_top_k_given_pdserves_scores_writes_slots_in_place_and_skips_sglangs():
    from pdserve_kernels.sglang_plugin.v4_hooks import _Indexer

    rt = _runtime()
    g = torch.Generator().manual_seed(2)
    table = torch.randperm(400, generator=g)[:2 * 33].view(2, 33).to(torch.int32)
    positions = torch.randint(0, 33 * 64, (2, 512), generator=g, dtype=torch.int32)
    positions[1, 200:] = -1
    call = _Indexer()
    call.positions, call.scores = positions, v4_hooks.placeholder_scores(positions, 33 * 64)
    rt.v4._local.indexer = call
    out = torch.full((2, 512), 7, dtype=torch.int32)
    ran = []
    scores = call.scores
    rt.v4.topk_v2(lambda *a, **k: ran.append(a), scores, torch.tensor([2112, 900]), table, out, 64, None)
    assert not ran and call.scores is None
    for r in range(2):
        for c in range(512):
            p = int(positions[r, c])
            assert int(out[r, c]) == (-1 if p < 0 else int(table[r, p // 64]) * 64 + p % 64)
    # other scores (not pdserve's, e.g. V3.2's decode top-k through the same name) go to SGLang's kernel
    rt.v4.topk_v2(lambda *a, **k: ran.append(a), torch.zeros(2, 64), torch.ones(2), table, out, 64, None)
    assert len(ran) == 1


def test_raw_indices_asked_for_leave_the_top_k_to_sglang_on_pdserves_scores():
    from pdserve_kernels.sglang_plugin.v4_hooks import _Indexer

    rt = _runtime()
    positions = torch.tensor([[3, 1, -1, -1]], dtype=torch.int32)
    call = _Indexer()
    call.positions, call.scores = positions, v4_hooks.placeholder_scores(positions, 8)
    rt.v4._local.indexer = call
    ran = []
    rt.v4.topk_v2(lambda *a, **k: ran.append(a), call.scores, torch.tensor([4]), torch.zeros(1, 1, dtype=torch.int32),
                  torch.full((1, 4), -1, dtype=torch.int32), 64, None, torch.zeros(1, 4, dtype=torch.int32))
    assert len(ran) == 1
    assert any("raw indices" in reason for _, reason in rt.fallbacks.seen())


# ---- the recorder (PDSERVE_DSA_RECORD_DIR: the GPU tier's comparison inside real SGLang) ----

def test_the_recorders_fp32_reference_reads_sglangs_padded_v4_views():
    from pdserve_kernels.sglang_plugin.v4_hooks import _exact_v4
    from pdserve_kernels.sparse_mla_reference import make_inputs, reference_from_inputs

    g = torch.Generator().manual_seed(7)
    inp = make_inputs("v4", 3, 1, 16, 128, topk_extra=64, page=256, extra_page=2, device="cpu", generator=g)
    assert inp["kv"].stride(0) == 260 * 576   # SGLang's window rows: 256 x 584 B rounded up to 576 B
    q = torch.zeros(3, 1, 64, 512, dtype=torch.bfloat16)
    q[:, :, :16] = inp["q"]
    sinks = torch.zeros(64)
    sinks[:16] = inp["sinks"]
    kw = dict(q=q, k_cache=inp["kv"].view(torch.float8_e4m3fn), indices=inp["indices"], softmax_scale=512 ** -0.5,
              attn_sink=sinks, extra_k_cache=inp["extra_kv"].view(torch.float8_e4m3fn),
              extra_indices_in_kvcache=inp["extra_indices"])
    expected, _ = reference_from_inputs(inp, 512 ** -0.5)
    assert torch.allclose(_exact_v4(kw, 16), expected[:, 0], atol=1e-5)


def test_with_a_recorder_each_eager_decode_call_is_compared_with_sglangs(monkeypatch, tmp_path):
    from pdserve_kernels.sglang_plugin.hooks import Runtime
    from pdserve_kernels.sglang_plugin.record import Recorder
    from pdserve_kernels.sglang_plugin.v4_hooks import _Indexer

    monkeypatch.setattr(Recorder, "active", staticmethod(lambda: True))   # no CUDA graph capture on this machine
    monkeypatch.setattr(v4_hooks, "_exact_v4", lambda kw, heads: kw["q"][:2, 0, :heads].float())
    kw = flash_mla_kwargs(B=2, h=64)
    kw["q"] = torch.randn(2, 1, 64, 512).to(torch.bfloat16)
    rt = Runtime("pdserve", str(tmp_path))
    rt.v4.kernels[None] = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}
    monkeypatch.setattr(rt.plans, "mla", _PlanStandIn().plan)
    layer = types.SimpleNamespace(tp_q_head_num=16, layer_id=5)
    flashmla = lambda **k: (k["q"].clone(), None)  # noqa: E731 - SGLang's kernel, as the stand-in plan computes
    rt.v4.forward(lambda *a, **k: rt.v4.flash_mla(flashmla, **kw)[0], object(), kw["q"], None, None, layer,
                   types.SimpleNamespace(forward_mode=_Mode(True)), 4)
    with open(rt.recorder.path) as lines:
        (record,) = [json.loads(line) for line in lines]
    assert record["op"] == "sparse_mla_decode" and record["layer"] == 5 and record["rel_l2"] == 0.0
    assert record["rel_l2_ours_vs_fp32"] < 1e-2 and record["exact_rows"] == 2

    # the indexer: SGLang's logits + top-k on the same inputs, compared as sets
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    positions = torch.tensor([[0, 5, 9, -1], [3, 1, -1, -1]], dtype=torch.int32)
    call = _Indexer(layer_id=3)
    call.positions, call.scores = positions, v4_hooks.placeholder_scores(positions, 256)
    call.sglang_logits = lambda: "sglang logits"
    rt.v4._local.indexer = call
    out = torch.full((2, 4), 7, dtype=torch.int32)

    def sglang_topk(scores, lens, tables, into, page, metadata):
        assert scores == "sglang logits"
        into.copy_(torch.tensor([[9, 0, 5, -1], [1, 3, 2, -1]], dtype=torch.int32))   # row 1 differs: 3 picks

    rt.v4.topk_v2(sglang_topk, call.scores, torch.tensor([10, 4]), table, out, 64, None)
    with open(rt.recorder.path) as lines:
        records = [json.loads(line) for line in lines]
    topk = [r for r in records if r["op"] == "indexer_topk"]
    assert len(topk) == 1 and topk[0]["layer"] == 3 and topk[0]["rows_identical_sets"] == 1
