"""The SGLang plugin on CPU: the decision rules, the status and fallback lines, registration with SGLang's
real HookRegistry, that every hooked target exists in the installed SGLang with the parameters the hook
takes, the fallback paths of the hooks, and the slot mapping. The kernels themselves run in the GPU tier
(tests/gpu/dsa)."""

import ast
import importlib.util
import json
import logging
import math
import pathlib
import sys
import tomllib
import types
from typing import ClassVar

import pytest

from pdserve_kernels.sglang_plugin import decide as decision
from pdserve_kernels.sglang_plugin import status as st

REPO = pathlib.Path(__file__).resolve().parents[2]

torch = pytest.importorskip("torch")


def facts(**kw):
    base = dict(capability=(9, 0), page_size=64, decode_impl="flashmla_kv", kv_store_fp8=True, kv_cache_dim=656,
                fused_topk=True, index_topk=2048)
    base.update(kw)
    return decision.BackendFacts(**base)


# ---- decisions ----

def test_the_reference_v32_fp8_setup_is_served_by_both_kernels():
    kernels, reasons = decision.decide(facts())
    assert kernels == {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"} and reasons == {}


def test_bf16_cache_with_flashmla_sparse_is_served():
    kernels, _ = decision.decide(facts(decode_impl="flashmla_sparse", kv_store_fp8=False, kv_cache_dim=576))
    assert kernels["sparse_mla_decode"] == "pdserve"


@pytest.mark.parametrize("change, ops, words", [
    (dict(capability=(10, 0)), {"indexer_topk", "sparse_mla_decode"}, "sm_100"),
    (dict(capability=(8, 0)), {"indexer_topk", "sparse_mla_decode"}, "sm_80"),
    (dict(page_size=256), {"indexer_topk", "sparse_mla_decode"}, "page size 256"),
    (dict(modules_error="RuntimeError: no fatbin"), {"indexer_topk", "sparse_mla_decode"}, "no fatbin"),
    (dict(fused_topk=False), {"indexer_topk"}, "fused top-k is off"),
    (dict(fused_topk=False, index_topk=0), {"indexer_topk"}, "does not produce; index_topk 0 is not"),  # both said
    (dict(decode_impl="fa3"), {"sparse_mla_decode"}, "'fa3' is not replaced"),
    (dict(kv_store_fp8=False), {"sparse_mla_decode"}, "bf16 cache"),
    (dict(kv_cache_dim=584), {"sparse_mla_decode"}, "584"),
    (dict(index_kpool=4), {"indexer_topk", "sparse_mla_decode"}, "index_kpool 4"),
])
def test_what_the_kernels_do_not_cover_stays_with_sglang_and_says_why(change, ops, words):
    kernels, reasons = decision.decide(facts(**change))
    assert {op for op, k in kernels.items() if k == "sglang"} == ops
    assert set(reasons) == ops and all(words in reasons[op] for op in ops)


# ---- the lines pdserve verify reads ----

def test_status_line_is_one_line_of_json_after_a_fixed_prefix():
    s = st.Status(requested="pdserve", kernels={"indexer_topk": "pdserve", "sparse_mla_decode": "sglang"},
                  reasons={"sparse_mla_decode": "decode backend 'fa3'\nis not replaced"}, tp_rank=3, device="cuda:3",
                  sm="9.0", sglang="0.5.17", pdserve_kernels="0.1.0")
    line = s.line()
    assert "\n" not in line and line.startswith(st.STATUS_PREFIX)
    assert json.loads(line[len(st.STATUS_PREFIX):]) == s.__dict__


def test_a_fallback_is_logged_once_per_reason(caplog):
    log = st.FallbackLog()
    with caplog.at_level(logging.INFO, logger="pdserve_kernels"):
        assert log.note("sparse_mla_decode", "h=7", "(1, 7, 576)")
        assert not log.note("sparse_mla_decode", "h=7", "(2, 7, 576)")
        assert log.note("sparse_mla_decode", "h=9", "(1, 9, 576)")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(st.FALLBACK_PREFIX)]
    assert len(lines) == 2
    assert json.loads(lines[0][len(st.FALLBACK_PREFIX):]) == {"op": "sparse_mla_decode", "reason": "h=7",
                                                               "shape": "(1, 7, 576)"}


def test_fallback_lines_per_op_are_capped_and_the_cap_is_said(caplog):
    log = st.FallbackLog()
    cap = st.FallbackLog.MAX_REASONS_PER_OP
    with caplog.at_level(logging.INFO, logger="pdserve_kernels"):
        logged = [log.note("indexer_topk", f"length {n} past the plan", "(1, 64, 128)") for n in range(cap + 40)]
        assert log.note("sparse_mla_decode", "h=7", "(1, 7, 576)")  # another op has its own count
    lines = [json.loads(r.getMessage()[len(st.FALLBACK_PREFIX):]) for r in caplog.records
             if r.getMessage().startswith(st.FALLBACK_PREFIX)]
    assert logged == [True] * (cap + 1) + [False] * 39
    assert len(lines) == cap + 2
    assert f"more than {cap} distinct fallback reasons" in lines[cap]["reason"]
    assert f"length {cap} past the plan" in lines[cap]["reason"]
    assert len(log.seen()) == cap + 41  # every reason is still counted


def test_a_reason_names_no_batch_size():
    assert st.batchless((7, 1, 64, 512)) == "[B, 1, 64, 512]"
    assert st.batchless((3,)) == "[B]"


def test_ran_is_logged_on_the_first_call_only(caplog):
    ran = st.RanLog()
    with caplog.at_level(logging.INFO, logger="pdserve_kernels"):
        assert ran.note("indexer_topk", "(4, 64, 128)") and not ran.note("indexer_topk", "(4, 64, 128)")
    assert sum(r.getMessage().startswith(st.RAN_PREFIX) for r in caplog.records) == 1


# ---- registration ----

def _fresh_plugin(monkeypatch, value):
    import pdserve_kernels.sglang_plugin as plugin

    monkeypatch.setattr(plugin, "_runtime", None)
    if value is None:
        monkeypatch.delenv(plugin.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV_SWITCH, value)
    return plugin


@pytest.fixture()
def registry():
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")

    class Recording:
        calls: ClassVar[list[tuple[object, object, object]]] = []

        @classmethod
        def register(cls, target, hook, hook_type):
            cls.calls.append((target, hook, hook_type))

    Recording.calls = []
    return Recording, hook_registry.HookType


def test_requested_registers_an_around_hook_on_each_target(monkeypatch, registry):
    reg, hook_type = registry
    plugin = _fresh_plugin(monkeypatch, "pdserve")
    runtime = plugin.load(reg)
    assert {t for t, _, _ in reg.calls} == set(plugin.all_targets("pdserve")) >= set(plugin.TARGETS)
    assert all(ht is hook_type.AROUND for _, _, ht in reg.calls)
    assert runtime.requested == "pdserve"
    assert hasattr(torch.ops.pdserve, "sparse_mla_decode")  # the ops are registered in this process


@pytest.mark.parametrize("lossy", [None, "1"])
def test_the_runtime_carries_the_lossy_opt_in_from_the_environment(monkeypatch, registry, lossy):
    # exact by default; $PDSERVE_DSA_LOSSY_BF16_DEQUANT=1 lets the MLA plans take the kernels that round e4m3 x scale
    reg, _ = registry
    plugin = _fresh_plugin(monkeypatch, "pdserve")
    if lossy is None:
        monkeypatch.delenv(plugin.ENV_LOSSY, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV_LOSSY, lossy)
    assert plugin.load(reg).lossy_bf16_dequant is (lossy == "1")


@pytest.mark.parametrize("value", [None, "sglang", "PDSERVE", "yes", ""])
def test_anything_but_pdserve_only_reports_status(monkeypatch, registry, value, caplog):
    reg, _ = registry
    plugin = _fresh_plugin(monkeypatch, value)
    with caplog.at_level(logging.WARNING, logger="pdserve_kernels"):
        runtime = plugin.load(reg)
    assert [t for t, _, _ in reg.calls] == list(plugin.all_targets("sglang")) and runtime.requested == "sglang"
    # the status hooks only: V3.2's backend and, for an SGLang with V4, V4's
    assert [t.rpartition(".")[2] for t, _, _ in reg.calls] == ["__init__"] * len(reg.calls)
    # a value that is neither switch (a typo) is named, with the fix
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if value in ("PDSERVE", "yes"):
        assert warned == [f"pdserve-kernels: PDSERVE_DSA_KERNELS={value!r} is neither 'pdserve' nor 'sglang': "
                          "SGLang's kernels serve (set it to 'pdserve' for pdserve's)"]
    else:
        assert warned == []


@pytest.mark.parametrize("value, lossy, warns", [("1", True, False), ("0", False, False), ("", False, False),
                                                 ("true", False, True), ("yes", False, True)])
def test_the_lossy_switch_is_exactly_1_and_a_typo_is_named(monkeypatch, caplog, value, lossy, warns):
    import pdserve_kernels.sglang_plugin as plugin

    monkeypatch.setenv(plugin.ENV_LOSSY, value)
    with caplog.at_level(logging.WARNING, logger="pdserve_kernels"):
        assert plugin.lossy_requested() is lossy
    assert bool([r for r in caplog.records if "PDSERVE_DSA_LOSSY_BF16_DEQUANT" in r.getMessage()]) is warns


def test_a_record_directory_that_cannot_be_made_names_the_variable(tmp_path):
    from pdserve_kernels.sglang_plugin.record import Recorder

    (tmp_path / "file").write_text("")
    with pytest.raises(RuntimeError, match=r"PDSERVE_DSA_RECORD_DIR=.*cannot be made .*writable directory"):
        Recorder(str(tmp_path / "file" / "records"))


@pytest.mark.parametrize("model", ["v32", "v4"])
def test_a_backend_the_plugin_cannot_read_keeps_sglangs_kernels_and_says_so(caplog, model):
    """The status hook runs after SGLang built the backend; whatever fails there must not stop SGLang's server."""
    from pdserve_kernels.sglang_plugin.hooks import Runtime

    rt = Runtime("pdserve")
    built = []
    backend = types.SimpleNamespace(device="no-such-device")  # torch.device() refuses it
    hooks = rt if model == "v32" else rt.v4
    with caplog.at_level(logging.ERROR, logger="pdserve_kernels"):
        hooks.backend_init(lambda b, mr: built.append(b), backend, types.SimpleNamespace())
    assert built == [backend] and rt.kernels == {} and rt.v4.kernels == {}
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith("pdserve-kernels: could not decide the kernels of SimpleNamespace (RuntimeError")
    assert line.endswith("SGLang's kernels serve")


def test_the_real_registry_wraps_a_target_and_the_original_still_runs(monkeypatch):
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    module = types.ModuleType("pdserve_fake_backend")

    seen = []

    class Backend:
        def forward_decode(self, x):
            seen.append(rt.in_decode())
            return x + 1

    module.Backend = Backend
    monkeypatch.setitem(__import__("sys").modules, "pdserve_fake_backend", module)
    from pdserve_kernels.sglang_plugin.hooks import Runtime

    rt = Runtime("pdserve")
    hook_registry.HookRegistry.register("pdserve_fake_backend.Backend.forward_decode", rt.forward_decode,
                                        hook_registry.HookType.AROUND)
    try:
        hook_registry.HookRegistry.apply_hooks()
        assert Backend().forward_decode(1) == 2 and seen == [True] and not rt.in_decode()
    finally:
        hook_registry.HookRegistry._hooks.pop("pdserve_fake_backend.Backend.forward_decode", None)
        hook_registry.HookRegistry._patched.discard("pdserve_fake_backend.Backend.forward_decode")


def test_the_entry_point_names_load():
    project = tomllib.loads((REPO / "kernels/python/pyproject.toml").read_text())
    eps = project["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {"pdserve_kernels": "pdserve_kernels.sglang_plugin:load"}
    assert set(project["tool"]["setuptools"]["packages"]) >= {"pdserve_kernels", "pdserve_kernels.sglang_plugin"}


# ---- the targets in the installed SGLang ----

def _method_params(target: str) -> list[str]:
    module_name, cls_name, method = target.rsplit(".", 2)
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module_name} is not installed")
    tree = ast.parse(pathlib.Path(spec.origin).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return [a.arg for a in item.args.args]
    raise AssertionError(f"{target} is not in {spec.origin}")


def _hook_params(method: str) -> list[str]:
    import inspect

    from pdserve_kernels.sglang_plugin.hooks import Runtime

    params = list(inspect.signature(getattr(Runtime, method)).parameters.values())
    return [p.name for p in params[2:] if p.kind is p.POSITIONAL_OR_KEYWORD]  # after self, original


@pytest.mark.parametrize("target, method", [
    ("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_paged", "indexer_topk"),
    ("sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend._forward_flashmla_kv", "mla_fp8"),
    ("sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend._forward_flashmla_sparse", "mla_bf16"),
])
def test_each_target_takes_the_parameters_its_hook_names(target, method):
    pytest.importorskip("sglang")
    sglang_params = _method_params(target)
    hook = _hook_params(method)
    # The hook's first parameter stands for SGLang's self; every other one must be SGLang's, in order.
    assert sglang_params[1:len(hook)] == hook[1:], (target, sglang_params, hook)


@pytest.mark.parametrize("target", ["sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend.__init__",
                                    "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend.__init__",
                                    "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend.forward_decode"])
def test_the_wrapped_backend_methods_exist(target):
    pytest.importorskip("sglang")
    assert _method_params(target)[:2] == ["self", "model_runner" if target.endswith("__init__") else "q"]


# ---- the hooks' fallbacks (no GPU: SGLang's original must take every call) ----

class _Mode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


def _runtime(serving=True):
    from pdserve_kernels.sglang_plugin.hooks import Runtime

    rt = Runtime("pdserve")
    if serving:
        rt.kernels[None] = {"indexer_topk": "pdserve", "sparse_mla_decode": "pdserve"}  # CPU tensors: index None
    return rt


def _indexer_call(rt, *, decode=True, init_tokens=0, q_shape=(4, 64, 128), method="PAGED"):
    calls = []

    def original(*args):
        calls.append(args)
        return "sglang"

    indexer = types.SimpleNamespace(num_init_tokens=init_tokens, num_local_tokens=0, index_topk=2048)
    metadata = types.SimpleNamespace(force_unfused_topk=False, topk_transform_method=types.SimpleNamespace(name=method),
                                     get_seqlens_int32=lambda: torch.ones(4, dtype=torch.int32))
    q = torch.zeros(q_shape, dtype=torch.float8_e4m3fn)
    out = rt.indexer_topk(original, indexer, types.SimpleNamespace(forward_mode=_Mode(decode)), 0, q,
                          torch.zeros(4, 64, 1), metadata)
    return out, calls


def test_indexer_outside_decode_or_when_not_serving_is_sglangs():
    assert _indexer_call(_runtime(), decode=False)[0] == "sglang"
    assert _indexer_call(_runtime(serving=False))[0] == "sglang"


@pytest.mark.parametrize("kw, words", [(dict(init_tokens=4), "index_init_tokens"),
                                       (dict(q_shape=(4, 32, 128)), "64 heads"),
                                       (dict(method="RAGGED"), "RAGGED")])
def test_indexer_shapes_it_cannot_serve_fall_back_and_say_so(kw, words):
    rt = _runtime()
    out, calls = _indexer_call(rt, **kw)
    assert out == "sglang" and len(calls) == 1
    assert any(op == "indexer_topk" and words in reason for op, reason in rt.fallbacks.seen())


def test_mla_outside_decode_is_sglangs_and_a_wrong_head_dim_falls_back():
    rt = _runtime()
    original = lambda backend, **kw: "sglang"  # noqa: E731
    q = torch.zeros(2, 128, 576, dtype=torch.bfloat16)
    layer = types.SimpleNamespace(tp_q_head_num=128, head_dim=576, layer_id=0)
    backend = types.SimpleNamespace(real_page_size=64, kv_cache_dim=656)
    args = dict(q_all=q, kv_cache=torch.zeros(64, 1, 656, dtype=torch.uint8), v_head_dim=512, sm_scale=0.1,
                layer=layer, metadata=None, page_table_1=torch.zeros(2, 2048, dtype=torch.int32))
    assert rt.mla_fp8(original, backend, **args) == "sglang" and not rt.fallbacks.seen()
    rt.forward_decode(lambda: rt.mla_fp8(original, backend, **{**args, "v_head_dim": 128}))
    assert any("v_head_dim 128" in reason for _, reason in rt.fallbacks.seen())


def test_bf16_mla_with_an_attention_sink_falls_back():
    rt = _runtime()
    original = lambda backend, **kw: "sglang"  # noqa: E731
    out = rt.forward_decode(lambda: rt.mla_bf16(original, object(), q_all=torch.zeros(1, 64, 576), kv_cache=None,
                                                v_head_dim=512, page_table_1=None, sm_scale=0.1,
                                                attn_sink=torch.zeros(64)))
    assert out == "sglang" and any("attn_sink" in reason for _, reason in rt.fallbacks.seen())


# ---- the serving paths, with the plans stood in (no GPU: what the hooks hand the ops, and what SGLang gets back) ----

class _Plans:
    """Stands in for PlanCache.indexer / .mla: records what was asked and each call's inputs."""

    def __init__(self, picks=None):
        self.asked, self.calls, self.picks = [], [], picks

    def indexer(self, device, batch, topk, max_len, max_blocks, ceiling=None):
        self.asked.append(dict(batch=batch, topk=topk, max_len=max_len, max_blocks=max_blocks, ceiling=ceiling))
        return lambda *inputs: self.calls.append(inputs) or self.picks

    def mla(self, device, layout, rows, h, topk, **kw):
        self.asked.append(dict(layout=layout, rows=rows, h=h, topk=topk, **kw))

        def run(q, cache, indices, sm_scale):
            self.calls.append(dict(q=q, cache=cache, indices=indices, sm_scale=sm_scale))
            return torch.full((*q.shape[:-1], 512), 0.5), None
        return run


@pytest.mark.parametrize("weights_3d", [False, True])
def test_a_served_indexer_call_maps_the_picks_to_slots_and_pads_sglangs_extra_rows(monkeypatch, weights_3d):
    rt = _runtime()
    rt.index_ceiling[None] = 65600  # what on_backend found for this device (a CPU tensor's device has no index)
    picks = torch.tensor([[0, 70, -1], [5, -1, -1]], dtype=torch.int32)  # positions within each request
    plans = _Plans(picks)
    monkeypatch.setattr(rt, "plans", plans)
    table = torch.tensor([[3, 9], [4, 1]], dtype=torch.int32)
    cache = torch.zeros(10, 64 * 132, dtype=torch.uint8)  # SGLang's index buffer: a page per row
    module = types.ModuleType("fake_sglang_indexer")
    module.get_token_to_kv_pool = lambda: "pool"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    indexer = type("Indexer", (), {"__module__": module.__name__, "num_init_tokens": 0, "num_local_tokens": 0,
                                   "index_topk": 3, "_get_index_k_read_buffer": lambda self, pool, layer: cache})()
    lengths = torch.tensor([100, 6], dtype=torch.int32)
    metadata = types.SimpleNamespace(force_unfused_topk=False, get_seqlens_int32=lambda: lengths,
                                     get_page_table_64=lambda: table)
    q = torch.zeros(3, 64, 128, dtype=torch.float8_e4m3fn)  # 3 rows: SGLang padded one (graph padding)
    weights = torch.arange(3 * 64, dtype=torch.float32).view(3, 64, *((1,) if weights_3d else ()))
    out = rt.indexer_topk(lambda *a: pytest.fail("SGLang's top-k ran"), indexer,
                          types.SimpleNamespace(forward_mode=_Mode(True)), 5, q, weights, metadata)
    assert plans.asked == [dict(batch=2, topk=3, max_len=128, max_blocks=2, ceiling=65600)]
    (call,) = plans.calls
    q_in, gates, cache_in, lengths_in, table_in = call
    assert q_in.shape == (2, 1, 64, 128) and torch.equal(gates, weights.view(3, 64)[:2])
    assert cache_in.shape == (10, 64, 1, 132) and cache_in.data_ptr() == cache.data_ptr()
    assert lengths_in is lengths and table_in is table
    # block_table[b][p // 64] * 64 + p % 64; -1 stays -1; the padded row selects nothing
    assert out.tolist() == [[3 * 64, 9 * 64 + 6, -1], [4 * 64 + 5, -1, -1], [-1, -1, -1]]
    assert not rt.fallbacks.seen() and "indexer_topk" in rt.ran._ran


@pytest.mark.parametrize("page_attribute", ["real_page_size", "physical_page_size"])  # SGLang 0.5.17, 0.5.23
def test_a_served_fp8_mla_call_views_sglangs_cache_by_its_page_size(monkeypatch, page_attribute):
    rt = _runtime()
    plans = _Plans()
    monkeypatch.setattr(rt, "plans", plans)
    backend = types.SimpleNamespace(kv_cache_dim=656, **{page_attribute: 64})
    layer = types.SimpleNamespace(tp_q_head_num=16, head_dim=576, layer_id=0)
    kv = torch.zeros(3 * 64, 1, 656, dtype=torch.uint8)   # SGLang's pool: a token per row
    table = torch.zeros(2, 2048, dtype=torch.int32)
    out = rt.forward_decode(lambda: rt.mla_fp8(lambda backend, **kw: pytest.fail("FlashMLA ran"), backend,
                                               q_all=torch.zeros(2, 16 * 576, dtype=torch.bfloat16), kv_cache=kv,
                                               v_head_dim=512, sm_scale=0.1, layer=layer, metadata=None,
                                               page_table_1=table))
    assert plans.asked == [dict(layout="v32", rows=2, h=16, topk=2048, bf16_kv=False, page=64,
                                lossy_bf16_dequant=False)]
    (call,) = plans.calls
    assert call["q"].shape == (2, 1, 16, 576) and call["cache"].shape == (3, 64, 1, 656)
    assert call["indices"].shape == (2, 1, 2048) and call["sm_scale"] == 0.1
    assert out.shape == (2, 1, 16, 512) and not rt.fallbacks.seen()


def test_a_served_bf16_mla_call_takes_sglangs_flat_pool(monkeypatch):
    rt = _runtime()
    plans = _Plans()
    monkeypatch.setattr(rt, "plans", plans)
    kv = torch.zeros(500, 1, 576, dtype=torch.bfloat16)
    out = rt.forward_decode(lambda: rt.mla_bf16(lambda backend, **kw: pytest.fail("FlashMLA ran"), object(),
                                                q_all=torch.zeros(4, 32, 576, dtype=torch.bfloat16), kv_cache=kv,
                                                v_head_dim=512, page_table_1=torch.zeros(4, 2048, dtype=torch.int32),
                                                sm_scale=0.2))
    assert plans.asked == [dict(layout="v32", rows=4, h=32, topk=2048, bf16_kv=True, page=1,
                                lossy_bf16_dequant=False)]
    assert plans.calls[0]["cache"] is kv and out.shape == (4, 32, 512)


# ---- the slot mapping and the recorder's arithmetic ----

def test_positions_map_through_the_page_table_to_physical_slots():
    from pdserve_kernels.sglang_plugin.hooks import physical_slots

    g = torch.Generator().manual_seed(5)
    table = torch.randperm(1000, generator=g)[:3 * 40].view(3, 40).to(torch.int32)
    positions = torch.randint(0, 40 * 64, (3, 300), generator=g, dtype=torch.int32)
    positions[1, 100:] = -1
    slots = physical_slots(positions.clone(), table)
    for r in range(3):
        for c in range(300):
            p = int(positions[r, c])
            assert int(slots[r, c]) == (-1 if p < 0 else int(table[r, p // 64]) * 64 + p % 64)


def test_the_recorder_compares_rows_as_sets(tmp_path):
    from pdserve_kernels.sglang_plugin.record import Recorder

    rec = Recorder(str(tmp_path))
    ref = torch.tensor([[5, 9, 2, -1], [1, 2, 3, 4]], dtype=torch.int32)
    ours = torch.tensor([[2, 5, 9, -1], [4, 3, 2, 7]], dtype=torch.int32)
    rec.topk(0, ours, ref, torch.tensor([3, 9], dtype=torch.int32))
    # A slot held twice matches once; a row with more picks than SGLang's is counted.
    twice = torch.tensor([[5, 5, 9, -1], [1, 2, 3, 4]], dtype=torch.int32)
    more = torch.tensor([[5, 9, 2, 7], [1, 2, 3, 4]], dtype=torch.int32)
    rec.topk(0, twice, ref, torch.tensor([3, 9], dtype=torch.int32))
    rec.topk(0, more, ref, torch.tensor([3, 9], dtype=torch.int32))
    o = torch.ones(2, 1, 4, 512, dtype=torch.bfloat16)
    rec.attention(0, "fp8", o, o.clone())
    off = o.clone()
    off[1] *= 1.5  # row 1 off by 50%: rel L2 over both rows sqrt(0.25 / 2)
    rec.attention(0, "fp8", off, o, exact=o.float().reshape(2, 4, 512)[:1] * 2)
    off[0, 0, 0, 0] = float("nan")
    rec.attention(0, "fp8", off, o, exact=o.float().reshape(2, 4, 512)[:1])
    assert rec.path
    with open(rec.path) as records:
        topk, dup, extra, same, differ, nan = [json.loads(line) for line in records]
    assert topk["rows_identical_sets"] == 1 and topk["overlap_min"] == pytest.approx(0.75)
    assert topk["overlap_mean"] == pytest.approx(0.875) and topk["selected_ours"] == [3, 4]
    assert (topk["rows_with_repeats"], topk["rows_selecting_another_count"]) == (0, 0)
    assert dup["overlap_min"] == pytest.approx(2 / 3) and dup["rows_identical_sets"] == 1
    assert (dup["rows_with_repeats"], dup["rows_selecting_another_count"]) == (1, 0)
    assert extra["overlap_min"] == 1.0 and extra["rows_identical_sets"] == 1
    assert (extra["rows_with_repeats"], extra["rows_selecting_another_count"]) == (0, 1)
    assert same["rel_l2"] == 0.0 and same["nonfinite"] == 0 and same["call"] == 0
    assert differ["call"] == 1 and differ["nonfinite"] == 0 and differ["rel_l2"] == pytest.approx((0.25 / 2) ** 0.5)
    assert differ["max_abs"] == pytest.approx(0.5) and differ["rel_l2_worst_row"] == pytest.approx(0.5)
    # against the exact result of row 0 (2x the outputs): both are half of it, so 0.5 away
    assert differ["exact_rows"] == 1
    assert differ["rel_l2_sglang_vs_fp32"] == pytest.approx(0.5) and differ["rel_l2_ours_vs_fp32"] == pytest.approx(0.5)
    assert nan["nonfinite"] == 1 and math.isnan(nan["rel_l2"]) and math.isnan(nan["rel_l2_ours_vs_fp32"])
    assert nan["rel_l2_sglang_vs_fp32"] == 0.0


def test_the_recorders_fp32_reference_reads_sglangs_packed_bf16_pool():
    from pdserve_kernels.sglang_plugin.hooks import _exact_attention

    g = torch.Generator().manual_seed(3)
    slots, h, topk = 300, 4, 16
    kv = torch.randn((slots, 1, 576), generator=g).to(torch.bfloat16)
    q = torch.randn((2, h, 576), generator=g).to(torch.bfloat16)
    ind = torch.randint(0, slots, (2, topk), generator=g, dtype=torch.int32)
    ind[1, 10:] = -1
    o = _exact_attention(q, kv, ind, 0.1, bf16_kv=True, page=1)
    for r in range(2):
        sel = ind[r][ind[r] >= 0].long()
        k = kv[sel, 0].float()
        p = torch.softmax(q[r].float() @ k.T * 0.1, dim=-1)
        assert torch.allclose(o[r], p @ k[:, :512], atol=1e-5)


# ---- plans and workspaces (stand-ins for the GPU's launcher and buffers) ----

class _Workspace:
    """ops.DsaWorkspace's sizes and fits(), without device memory."""

    def __init__(self, max_rows, max_len, device=None):
        from pdserve_kernels.dsa_indexer import SELECT_CHUNK, STATE_INTS_PER_ROW

        self.max_rows, self.max_len = max_rows, max(1, max_len)
        self.state_ints = max_rows * STATE_INTS_PER_ROW
        self.scratch_ints = max_rows * -(-self.max_len // SELECT_CHUNK) * SELECT_CHUNK * 3

    def fits(self, plan):
        return plan.state_ints <= self.state_ints and plan.scratch_ints <= self.scratch_ints


class _IndexerPlan:
    def __init__(self, batch, next_n, topk, max_len, *, device=None, workspace=None, max_blocks=None):
        assert max_blocks is None  # the op clamps to each call's table
        self.batch, self.max_len, self.workspace = batch, max_len, workspace


@pytest.fixture
def plan_cache(monkeypatch):
    from pdserve_kernels import ops
    from pdserve_kernels.dsa_indexer import plan_dsa
    from pdserve_kernels.sglang_plugin import plans

    launcher = types.SimpleNamespace(plan=lambda b, n, k, m, **kw: plan_dsa(b, n, k, m, 132, **kw))
    monkeypatch.setattr(ops, "indexer_for", lambda device=None: launcher)
    monkeypatch.setattr(ops, "DsaWorkspace", _Workspace)
    monkeypatch.setattr(ops, "DsaIndexerPlan", _IndexerPlan)
    monkeypatch.setattr(plans, "_stream_key", lambda device: 7)
    capturing = {"now": False}
    monkeypatch.setattr(plans, "_capturing", lambda: capturing["now"])
    return plans.PlanCache(), capturing


def test_length_buckets_are_at_most_a_quarter_over_and_few():
    from pdserve_kernels.sglang_plugin.plans import len_bucket

    buckets = {len_bucket(n) for n in range(1, 200_001)}
    assert len(buckets) <= 4 * 6 + 4  # 4096 .. 262144: four per doubling
    for n in (1, 4096, 4097, 16384, 16385, 65537, 163840, 163841):
        b = len_bucket(n)
        assert n <= b <= max(-(-n // 4096) * 4096, 1.25 * n) and b % 4096 == 0, (n, b)


# SGLang's request table is its context length plus 4 spare tokens wide (0.5.17 and 0.5.23: kv_cache_configurator's
# extra_max_context_len), and its decode graphs are captured at that width: 65540 tokens at a 64K context.
GRAPH_TOKENS = 65536 + 4


def test_a_bucket_never_passes_the_servers_longest_row():
    from pdserve_kernels.sglang_plugin.plans import len_bucket, plan_bound

    v32_graph = -(-GRAPH_TOKENS // 64) * 64  # 1025 pages of 64 tokens
    assert len_bucket(v32_graph) == 81920 and plan_bound(v32_graph, v32_graph) == v32_graph
    for n in (1, 5000, 16385, 40000, v32_graph):
        assert n <= plan_bound(n, v32_graph) == min(len_bucket(n), v32_graph)
    assert plan_bound(70000, v32_graph) == len_bucket(70000)  # past the ceiling: never below the call's own bound
    assert plan_bound(16385, None) == len_bucket(16385)


def test_the_ceiling_is_sglangs_request_table_in_index_pages():
    from pdserve_kernels.sglang_plugin.hooks import index_ceiling

    backend = types.SimpleNamespace(req_to_token=torch.zeros(3, GRAPH_TOKENS, dtype=torch.int32))
    assert index_ceiling(backend, 64) == 1025 * 64  # V3.2: pages of 64 tokens
    assert index_ceiling(backend, 256) == 257 * 64  # V4's C4 indexer: 64 compressed positions per 256 tokens
    assert index_ceiling(types.SimpleNamespace(), 64) is None
    assert index_ceiling(backend, 0) is None


def test_a_graph_captured_at_sglangs_table_width_gets_the_plan_of_exactly_that_width(plan_cache):
    from pdserve_kernels.dsa_indexer import plan_dsa

    cache, capturing = plan_cache
    device, width = torch.device("cuda", 0), -(-GRAPH_TOKENS // 64)
    capturing["now"] = True
    captured = cache.indexer(device, 8, 2048, width * 64, width, ceiling=width * 64)
    capturing["now"] = False
    assert captured.max_len == width * 64
    exact, bucketed = plan_dsa(8, 1, 2048, width * 64, 132), plan_dsa(8, 1, 2048, 81920, 132)
    # what the bucket alone cost on one H100: 26 pages per scoring CTA instead of 21 on every captured step
    assert (exact.chunk_pages, bucketed.chunk_pages) == (21, 26)


def test_eager_decode_with_growing_contexts_makes_few_plans_and_keeps_one_workspace(plan_cache):
    cache, _ = plan_cache
    device = torch.device("cuda", 0)
    for length in range(2000, 70_000, 7):  # one token a step for ~10 000 steps, batch 200 (past any graph)
        plan = cache.indexer(device, 200, 2048, length, -(-length // 64))
        assert plan.max_len >= length
    assert len(cache) <= 20
    (pool,) = cache._dsa_workspaces.values()
    assert len(pool) == 1 and pool[0].max_len >= 70_000
    # every plan left holds the one live workspace
    assert all(p.workspace is pool[0] for p in cache._plans.values())


def test_a_workspace_a_graph_was_captured_with_stays(plan_cache):
    cache, capturing = plan_cache
    device = torch.device("cuda", 0)
    capturing["now"] = True
    captured = cache.indexer(device, 8, 2048, 65536, 1024)  # the graph of batch 8, the context bound
    capturing["now"] = False
    grown = cache.indexer(device, 512, 2048, 100_000, 1563)  # a larger eager batch: a larger workspace
    assert grown.workspace is not captured.workspace
    assert cache.indexer(device, 8, 2048, 65536, 1024) is captured  # the captured plan and its workspace stay
    (pool,) = cache._dsa_workspaces.values()
    assert captured.workspace in pool and grown.workspace in pool
    # a third, larger eager workspace replaces the eager one only
    larger = cache.indexer(device, 1024, 2048, 131072, 2048)
    assert pool == [captured.workspace, larger.workspace]
    assert cache.indexer(device, 512, 2048, 100_000, 1563).workspace is larger.workspace  # made again on it


def test_a_shape_the_launcher_refuses_is_refused_from_the_cache_after_its_first_call(plan_cache, monkeypatch):
    from pdserve_kernels import ops

    cache, _ = plan_cache
    launcher, asked = ops.indexer_for(), []
    planned = launcher.plan
    monkeypatch.setattr(launcher, "plan", lambda *a, **kw: asked.append(a) or planned(*a, **kw))
    device = torch.device("cuda", 0)
    errors = []
    for _ in range(3):  # one call per layer of a step: planned once, refused from the cache twice
        with pytest.raises(ValueError) as refused:
            cache.indexer(device, 8, 0, 8192, 128)  # top-0: plan_dsa refuses it
        errors.append(str(refused.value))
    assert len(asked) == 1 and len(set(errors)) == 1 and "topk" in errors[0]
    assert len(cache) == 0 and cache.indexer(device, 8, 2048, 8192, 128) is not None and len(asked) == 2
    # the MLA side goes through the same cache
    monkeypatch.setattr(ops, "mla_for", lambda device=None: types.SimpleNamespace(
        make_plan=lambda *a, **kw: asked.append(a) or (_ for _ in ()).throw(ValueError("h=7 has no kernel"))))
    for _ in range(2):
        with pytest.raises(ValueError, match="h=7"):
            cache.mla(device, "v32", 8, 7, 2048, bf16_kv=False, page=64)
    assert len(asked) == 3


def test_workspaces_are_per_device_and_stream(plan_cache):
    cache, _ = plan_cache
    a = cache.indexer(torch.device("cuda", 0), 8, 2048, 8192, 128)
    b = cache.indexer(torch.device("cuda", 1), 8, 2048, 8192, 128)  # the legacy stream is handle 0 on each GPU
    assert a.workspace is not b.workspace and len(cache._dsa_workspaces) == 2
