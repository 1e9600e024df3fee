"""DeepSeek V4 decode (SGLang's dsv4 attention backend) on pdserve's kernels: the hooks, wrapped around SGLang's
(HookType.AROUND, so SGLang's own kernel takes every call the plugin does not serve).

Where SGLang's V4 decode calls its kernels (../shared/facts/sglang-dsv4.md §5 and §9; the CPU tests check every
target and the parameters the hooks name against both versions' sources):

* sparse MLA decode: FlashMLA's ``flash_mla_with_kvcache``, called by keyword from ``DeepseekV4AttnBackend.forward``
  with the window cache (page 256) as ``k_cache`` and, on C4 / C128 layers, the compressed cache (page 64 / 2) as
  ``extra_k_cache`` (on sm_120 SGLang's ``flash_mla_with_kvcache_sm120``, keywords only, the same caches). SGLang
  0.5.17 imports it from ``sgl_kernel.flash_mla`` inside ``forward`` (so the registry's patch of that module is what
  it finds); 0.5.23 calls ``sglang.kernels.ops.attention.flash_mla_interface``'s through a ``functools.partial``
  bound in the backend's ``__init__`` (general plugins are applied before any backend is built, so the partial
  binds the patched function). pdserve's kernel takes both sources in one launch
  (each with its own page size), the sink and the softmax scale; it skips -1 indices and reads no lengths (SGLang
  keeps every index at or past its length -1: §5.2).
* C4 indexer: ``deep_gemm.fp8_paged_mqa_logits`` (imported inside ``C4IndexerBackendMixin.forward_c4_indexer``;
  or, on sm_120 / with SGLANG_FP8_PAGED_MQA_LOGITS_TORCH, SGLang's torch logits of the same arguments), then
  SGLang's top-k writing C4 slots in place, on decode its v2 kernel: ``topk_transform_512_v2`` (0.5.17) /
  ``topk_transform_paged_v2`` (0.5.23), module-level names of ``sglang.srt.layers.attention.dsv4.indexer``. The
  logits hook runs pdserve's fused indexer + exact top-k instead and returns placeholder scores that make SGLang's
  top-k select exactly those positions whatever top-k it runs (-inf, 0 at the picks: v1, torch and FlashInfer
  included); the v2 top-k hook, given those scores, writes the picks' slots (page_table[p // 64] * 64 + p % 64, -1
  padded) into SGLang's buffer itself and skips SGLang's kernel.

Decode steps only: ``DeepseekV4AttnBackend.forward`` and ``forward_c4_indexer`` mark the call when its batch is a
plain decode batch; MTP target-verify and draft-extend (which use the same FlashMLA call) and prefill stay with
SGLang. Plans depend on shapes only (rows, heads, index counts, pages) and are made on a shape's first call, which
is an eager warm-up pass of SGLang's graph runner before each capture, with their workspaces (plans.py).
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass

from . import decide as decision
from .status import PDSERVE, Status, all_sglang, batchless, guarded_on_backend, log_status

V4_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend"
V4_INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
# SGLang's SM120 V4 decode (FlashInfer's CUTLASS kernel, or Triton / torch), imported inside forward on sm_120
FLASH_MLA_SM120 = "sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120"
# The indexer's logits, all called with the same 8 positional arguments: DeepGEMM on sm_90 / sm_100 (imported inside
# forward_c4_indexer), SGLang's torch versions (module-level names read there at call time) on sm_120 or with
# SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.
LOGITS = "deep_gemm.fp8_paged_mqa_logits"
LOGITS_TORCH = (f"{V4_INDEXER}.fp8_paged_mqa_logits_torch_sm120", f"{V4_INDEXER}.fp8_paged_mqa_logits_torch")

# What differs between the SGLang versions the plugin serves (checked against each version's source on CPU).
FLASH_MLA = {"0.5.17": "sgl_kernel.flash_mla.flash_mla_with_kvcache",
             "0.5.23": "sglang.kernels.ops.attention.flash_mla_interface.flash_mla_with_kvcache"}
TOPK_V2 = {"0.5.17": f"{V4_INDEXER}.topk_transform_512_v2",
           "0.5.23": f"{V4_INDEXER}.topk_transform_paged_v2"}

V4_ENTRY_BYTES = 584   # FlashMLA's V4 cache entry: 448 e4m3 + 64 bf16 RoPE + 7 UE8M0 scales + 1 pad
V4_DQK, DV = 512, 512
INDEX_ENTRY_BYTES = 132  # the FP8 index key: 128 e4m3 + one fp32 scale


def sglang_generation() -> str | None:
    """Which of FLASH_MLA's keys the installed SGLang's V4 decode follows (None: no SGLang with V4): 0.5.23 moved
    FlashMLA into sglang.kernels.ops.attention.flash_mla_interface."""
    try:
        if importlib.util.find_spec("sglang.srt.layers.attention.deepseek_v4_backend") is None:
            return None
        moved = importlib.util.find_spec("sglang.kernels.ops.attention.flash_mla_interface") is not None
    except (ImportError, ValueError):
        return None
    return "0.5.23" if moved else "0.5.17"


def targets(generation: str | None, *, serving: bool, deep_gemm: bool = True) -> dict[str, str]:
    """SGLang target -> the Runtime attribute (dotted) wrapped around it. Only the status hook unless `serving`;
    nothing for an SGLang without V4; DeepGEMM's logits only where DeepGEMM is installed."""
    if generation is None:
        return {}
    found = {f"{V4_BACKEND}.__init__": "v4.backend_init"}
    if not serving:
        return found
    found.update({f"{V4_BACKEND}.forward": "v4.forward", FLASH_MLA[generation]: "v4.flash_mla",
                  FLASH_MLA_SM120: "v4.flash_mla_sm120",
                  f"{V4_INDEXER}.C4IndexerBackendMixin.forward_c4_indexer": "v4.c4_indexer",
                  TOPK_V2[generation]: "v4.topk_v2", **dict.fromkeys(LOGITS_TORCH, "v4.logits")})
    if deep_gemm:
        found[LOGITS] = "v4.logits"
    return found


@dataclass
class _Forward:
    """The DeepseekV4AttnBackend.forward call in progress on this thread."""

    decode: bool
    heads: int | None  # the layer's real query heads (SGLang pads q to 64 under TP > 1)
    layer_id: int = -1


@dataclass
class _Indexer:
    """The forward_c4_indexer call in progress on this thread, and the picks of its last logits call."""

    layer_id: int = -1
    scores: object = None     # the placeholder scores handed to SGLang
    positions: object = None  # pdserve's picks for them: int32 [rows, topk], positions in the compressed sequence
    sglang_logits: object = None  # with a recorder: a callable giving SGLang's own logits of the last call


class V4Hooks:
    """The V4 half of the plugin's Runtime (hooks.py): its plans, fallback and "ran" logs are the runtime's."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.kernels: dict[int, dict[str, str]] = {}  # device index -> op -> kernel
        self.index_topk: dict[int, int] = {}  # device index -> the model's index_topk (the C4 indexer's picks)
        self.index_ceiling: dict[int, int | None] = {}  # device index -> the longest C4 row (plans.py)
        self._local = threading.local()

    # ---- once per backend ----
    def on_backend(self, backend, model_runner) -> Status:
        import torch

        from .hooks import OFF_REASON, _load_modules, _tp_rank, _version, index_ceiling

        device = _with_index(torch.device(getattr(backend, "device", None) or "cuda"))
        major, minor = torch.cuda.get_device_capability(device)
        where = {"tp_rank": _tp_rank(model_runner), "device": str(device), "sm": f"{major}.{minor}",
                 "sglang": _version("sglang"), "pdserve_kernels": _version("pdserve-kernels"), "model": "deepseek_v4"}
        if self.runtime.requested != PDSERVE:
            status = all_sglang(self.runtime.requested, OFF_REASON, **where)
        else:
            self.index_topk[device.index] = _index_topk(model_runner)
            facts = decision.V4Facts(
                capability=(major, minor), page_size=int(getattr(backend, "page_size", 0) or 0),
                index_topk=self.index_topk[device.index],
                fp4_indexer=bool(getattr(backend, "enable_deepseek_v4_fp4_indexer", False)),
                v41=bool(getattr(backend, "is_dsv41", False)), trtllm=bool(getattr(backend, "trtllm_attn", False)),
                modules_error=_load_modules(device) if (major, minor) in decision.SUPPORTED_SM else None)
            kernels, reasons = decision.decide_v4(facts)
            self.index_ceiling[device.index] = index_ceiling(backend, facts.page_size)
            status = Status(requested=self.runtime.requested, kernels=kernels, reasons=reasons,
                            lossy_bf16_dequant=self.runtime.lossy_bf16_dequant, **where)
            self.kernels[device.index] = kernels
        log_status(status)
        return status

    def serves(self, op: str, device) -> bool:
        return self.kernels.get(device.index, {}).get(op) == PDSERVE

    # ---- the hooks ----
    def backend_init(self, original, backend, model_runner, *args, **kwargs):
        original(backend, model_runner, *args, **kwargs)
        guarded_on_backend(self.on_backend, backend, model_runner)

    def forward(self, original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
        previous = getattr(self._local, "forward", None)
        self._local.forward = _Forward(decode=_is_plain_decode(forward_batch),
                                       heads=getattr(layer, "tp_q_head_num", None),
                                       layer_id=int(getattr(layer, "layer_id", -1)))
        try:
            return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
        finally:
            self._local.forward = previous

    def flash_mla(self, original, *args, **kwargs):
        call = getattr(self._local, "forward", None)
        q = kwargs.get("q")
        if call is None or not call.decode or q is None or not self.serves("sparse_mla_decode", q.device):
            return original(*args, **kwargs)
        shape = tuple(q.shape)
        why = _mla_refusal(args, kwargs, call.heads)
        if why:
            self.runtime.fallback("sparse_mla_decode", why, shape)
            return original(*args, **kwargs)
        try:
            out, lse = self._mla(kwargs, call.heads or q.shape[2])
        except ValueError as e:  # the op refuses before launching anything: FlashMLA takes the call
            self.runtime.fallback("sparse_mla_decode", str(e), shape)
            return original(*args, **kwargs)
        self.runtime.ran.note("sparse_mla_decode", f"v4 {shape}")
        recorder = self.runtime.recorder
        if recorder is not None and recorder.active():
            heads = call.heads or q.shape[2]
            reference = original(*args, **kwargs)[0]
            recorder.attention(call.layer_id, "v4", out[:, :, :heads], reference[:, :, :heads],
                               exact=_exact_v4(kwargs, heads))
        return out, lse

    def flash_mla_sm120(self, original, **kwargs):
        """SGLang's SM120 entry (keywords only, the same V4 FP8 caches, no FlashMLA schedule): the same contract."""
        return self.flash_mla(lambda **kw: original(**kwargs), **{"is_fp8_kvcache": True, **kwargs})

    def _mla(self, kw, heads: int):
        """pdserve's sparse MLA decode of one FlashMLA call over the layer's real `heads`. Under TP > 1 SGLang pads q
        to 64 heads (uninitialized past `heads`, zero sinks) because FlashMLA takes only 64 or 128, and keeps only the
        real heads' output (o[:, :heads]): the kernel runs the real heads alone (any h), and the padded heads of the
        returned output are left unwritten, as FlashMLA's are garbage from garbage q there."""
        q, cache, indices = kw["q"], kw["k_cache"], kw["indices"]
        extra, extra_indices = kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache")
        sinks = kw.get("attn_sink")
        padded = q.shape[2]
        if heads < padded:
            q = q[:, :, :heads].contiguous()
            sinks = sinks[:heads] if sinks is not None else None
        pages = [cache.shape[1]] + ([extra.shape[1]] if extra is not None else [])
        plan = self.runtime.plans.mla(q.device, "v4", q.shape[0] * q.shape[1], heads, indices.shape[-1],
                                      topk_extra=extra_indices.shape[-1] if extra is not None else 0,
                                      bf16_kv=False, page=min(pages))
        out, lse = plan(q, cache, indices, kw["softmax_scale"], sinks=sinks, extra_kv=extra,
                        extra_indices=extra_indices)
        if heads < padded:
            full = out.new_empty((*out.shape[:2], padded, out.shape[-1]))
            full[:, :, :heads].copy_(out)
            out = full
        # FlashMLA returns lse as [B, h, next_n]; SGLang keeps only the output (here lse has the real heads only).
        return out, lse.transpose(1, 2)

    def c4_indexer(self, original, backend, *args, **kwargs):
        forward_batch = kwargs.get("forward_batch", args[3] if len(args) > 3 else None)
        device = _call_device(backend, kwargs.get("x", args[0] if args else None))
        if (forward_batch is None or device is None or not _is_plain_decode(forward_batch)
                or not self.serves("indexer_topk", device)):
            return original(backend, *args, **kwargs)
        previous = getattr(self._local, "indexer", None)
        c4 = kwargs.get("c4_indexer", args[2] if len(args) > 2 else None)
        self._local.indexer = _Indexer(layer_id=int(getattr(c4, "layer_id", -1)))
        try:
            return original(backend, *args, **kwargs)
        finally:
            self._local.indexer = previous

    def logits(self, original, q, kv_cache, weights, context_lens, block_table, schedule, max_context_len,
               clean_logits=False, *args, **kwargs):
        call = getattr(self._local, "indexer", None)
        if call is None or args or kwargs:
            return original(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits,
                            *args, **kwargs)
        shape = tuple(q.shape)
        why = _indexer_refusal(q, kv_cache, weights, context_lens, block_table)
        if why:
            self.runtime.fallback("indexer_topk", why, shape)
            return original(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits)
        topk = self.index_topk.get(q.device.index, decision.V4_INDEX_TOPK[0])
        try:
            plan = self.runtime.plans.indexer(q.device, q.shape[0], topk, int(max_context_len), block_table.shape[1],
                                              ceiling=self.index_ceiling.get(q.device.index))
            positions = plan(q, weights, kv_cache, context_lens, block_table)
        except ValueError as e:
            self.runtime.fallback("indexer_topk", str(e), shape)
            return original(q, kv_cache, weights, context_lens, block_table, schedule, max_context_len, clean_logits)
        call.positions, call.scores = positions, placeholder_scores(positions, int(max_context_len))
        if self.runtime.recorder is not None:
            call.sglang_logits = lambda: original(q, kv_cache, weights, context_lens, block_table, schedule,
                                                  max_context_len, clean_logits)
        self.runtime.ran.note("indexer_topk", f"v4 {shape}")
        return call.scores

    def topk_v2(self, original, scores, seq_lens, page_tables, out_page_indices, page_size, metadata, *args,
                **kwargs):
        call = getattr(self._local, "indexer", None)
        if call is None or call.scores is None or scores is not call.scores:
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, *args, **kwargs)
        raw = args[0] if args else kwargs.get("out_raw_indices")
        positions, sglang_logits = call.positions, call.sglang_logits
        call.scores = call.positions = call.sglang_logits = None
        if raw is not None or page_tables is None or tuple(out_page_indices.shape) != tuple(positions.shape):
            # The placeholder scores make SGLang's own top-k pick exactly pdserve's positions.
            self.runtime.fallback("indexer_topk", "raw indices asked for, or no page table, or another output "
                                  "shape: SGLang's top-k transforms pdserve's picks", tuple(scores.shape))
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, *args, **kwargs)
        from .hooks import physical_slots

        out_page_indices.copy_(physical_slots(positions, page_tables, int(page_size)))
        recorder = self.runtime.recorder
        if recorder is not None and recorder.active() and sglang_logits is not None:
            # SGLang's own logits and top-k on the same inputs, into a scratch buffer
            reference = out_page_indices.new_full(out_page_indices.shape, -1)
            original(sglang_logits(), seq_lens, page_tables, reference, page_size, metadata, *args, **kwargs)
            recorder.topk(call.layer_id, out_page_indices, reference, seq_lens.reshape(-1))
        return None


def _exact_v4(kw, heads: int):
    """The fp32 reference (sparse_mla_reference) of the first rows of one FlashMLA call, from the same cache bytes:
    SGLang's views [blocks, page, 1, 584] over rows padded to a multiple of 576 B, read as [blocks, row stride]."""
    import torch

    from pdserve_kernels.sparse_mla_reference import LAYOUTS, reference_decode

    from .record import EXACT_ROWS

    def blocks(view):
        raw = view.view(torch.uint8)
        return raw.as_strided((raw.shape[0], raw.shape[1] * V4_ENTRY_BYTES), (raw.stride(0), 1), raw.storage_offset())

    q, cache, extra = kw["q"], kw["k_cache"], kw.get("extra_k_cache")
    n = min(EXACT_ROWS, q.shape[0])
    sinks = kw.get("attn_sink")
    o, _ = reference_decode(
        LAYOUTS["v4"], q[:n, 0, :heads], blocks(cache), cache.shape[1], kw["indices"][:n].reshape(n, -1),
        float(kw["softmax_scale"]), sinks[:heads] if sinks is not None else None,
        **({} if extra is None else {"extra_cache": blocks(extra), "extra_page": extra.shape[1],
                                          "extra_indices": kw["extra_indices_in_kvcache"][:n].reshape(n, -1)}))
    return o


def placeholder_scores(positions, width: int):
    """fp32 [rows, width] scores, -inf but 0 at each row's picks (positions, -1 padded): any exact top-k over the
    scores masked to a row's length selects exactly that row's picks (pdserve's picks are min(length, topk) of the
    positions below the length; every other score is -inf). Row stride a multiple of 4 (SGLang's top-k asks it)."""
    import torch

    rows = positions.shape[0]
    stride = -(-(width + 1) // 4) * 4
    scores = torch.full((rows, stride), float("-inf"), dtype=torch.float32, device=positions.device)
    # -1 padding goes to the spare column past `width`.
    scores.scatter_(1, torch.where(positions < 0, width, positions).long(), 0.0)
    return scores[:, :width]


def _index_topk(model_runner) -> int:
    """The model's index_topk (SGLang's C4Indexer takes it from the same config), 0 when it does not say."""
    config = getattr(getattr(model_runner, "model_config", None), "hf_text_config", None)
    return int(getattr(config, "index_topk", 0) or 0)


def _with_index(device):
    """`device` with its index: a CUDA device without one is the current device (the kernel table is keyed by
    index, and SGLang's V4 backend keeps torch.device(model_runner.device), which is plain "cuda")."""
    import torch

    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _call_device(backend, x):
    """Where a forward_c4_indexer call runs: its input's device, else the backend's (with its index); None if
    neither says. (The GPU tier's first V4 run found the indexer never served: the backend's device had no index,
    so the lookup missed the table on_backend had filled under index 0.)"""
    import torch

    if isinstance(x, torch.Tensor):
        return x.device
    device = getattr(backend, "device", None)
    return None if device is None else _with_index(device)


def _is_plain_decode(forward_batch) -> bool:
    """A decode batch: not MTP's target-verify or draft-extend, not prefill, not idle."""
    mode = getattr(forward_batch, "forward_mode", None)
    return bool(mode is not None and mode.is_decode())


def _mla_refusal(args, kw, heads: int | None) -> str | None:
    """Why this FlashMLA call is not one pdserve's kernel computes the same, if it is not."""
    import torch

    if args:
        return "positional arguments (SGLang's V4 decode passes every argument by keyword)"
    q, cache, indices = kw.get("q"), kw.get("k_cache"), kw.get("indices")
    extra, extra_indices = kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache")
    if kw.get("block_table") is not None or kw.get("cache_seqlens") is not None or indices is None:
        return "a dense (block_table) call, not sparse decode"
    if not kw.get("is_fp8_kvcache", False) or kw.get("kv_format") not in (None, "v4"):
        return f"cache format {kw.get('kv_format')!r} (fp8 {bool(kw.get('is_fp8_kvcache'))}): only V4's FP8 layout"
    if kw.get("descale_q") is not None or kw.get("descale_k") is not None or kw.get("causal", False):
        return "descale or causal arguments"
    if q.dtype != torch.bfloat16 or q.dim() != 4 or q.shape[1] != 1 or q.shape[-1] != V4_DQK:
        return f"q {q.dtype} {batchless(q.shape)} (the hook serves bf16 [B, 1, h, 512])"
    if heads is not None and not 0 < heads <= q.shape[2]:
        return f"the layer's {heads} heads do not fit q's {q.shape[2]}"
    if int(kw.get("head_dim_v", DV)) != DV:
        return f"head_dim_v {kw.get('head_dim_v')} (the kernels write 512)"
    if kw.get("softmax_scale") is None:
        return "no softmax_scale"
    for name, t in (("k_cache", cache), ("extra_k_cache", extra)):
        if t is not None and (t.dim() != 4 or t.shape[2] != 1 or t.shape[-1] != V4_ENTRY_BYTES):
            return f"{name} of shape {tuple(t.shape)} (V4's FP8 entries: [blocks, page, 1, 584])"
    if (extra is None) != (extra_indices is None):
        return "extra_k_cache without extra_indices_in_kvcache, or the reverse"
    sink = kw.get("attn_sink")
    if sink is not None and (sink.dtype != torch.float32 or tuple(sink.shape) != (q.shape[2],)
                             or not sink.is_contiguous()):
        return f"attn_sink {sink.dtype} {tuple(sink.shape)} (fp32 [h])"
    return None


def _indexer_refusal(q, kv_cache, weights, context_lens, block_table) -> str | None:
    """Why this logits call is not one pdserve's fused indexer answers, if it is not."""
    import torch

    if isinstance(q, tuple) or q.dtype != torch.float8_e4m3fn:
        return "q is not FP8 (the FP4 indexer): the kernel reads FP8 q and keys"
    if q.dim() != 4 or q.shape[1] != 1 or tuple(q.shape[2:]) != (decision.INDEX_HEADS, decision.INDEX_DIM):
        return f"indexer q of shape {batchless(q.shape)} (the kernel takes [B, 1, 64, 128])"
    if kv_cache.dim() != 4 or tuple(kv_cache.shape[1:]) != (decision.PAGE, 1, INDEX_ENTRY_BYTES):
        return f"index cache of shape {tuple(kv_cache.shape)} (the kernel reads [pages, 64, 1, 132])"
    if context_lens.dim() == 2 and context_lens.shape[1] != 1:
        return "per-token lengths (speculative decoding)"
    if weights.shape[0] != q.shape[0] or block_table.shape[0] != q.shape[0]:
        return "weights or block table rows differ from q's"
    return None
