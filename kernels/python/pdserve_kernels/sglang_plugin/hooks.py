"""The functions the plugin wraps around SGLang's (HookType.AROUND: each gets SGLang's original first and
calls it whenever the plugin does not serve the call, so SGLang's behaviour is the fallback everywhere).

Where (SGLang 0.5.17 and 0.5.23 agree on these signatures; CPU tests check them against the installed one, and
the backend attributes the status reads against both versions' sources: the page size is the one that moved):
* DeepseekSparseAttnBackend.__init__: decide once per backend which ops to serve (decide.py), log the status.
* DeepseekSparseAttnBackend.forward_decode: mark the call as a decode step, so the MLA hooks below leave
  prefill (which SGLang also runs through _forward_flashmla_kv / _forward_flashmla_sparse) alone.
* Indexer._get_topk_paged (decode only): DeepGEMM's paged logits + SGLang's top-k -> our fused indexer and
  exact top-k, whose positions are mapped through the page table to physical KV slots (SGLang's fused
  top-k contract: page_table[row, p // 64] * 64 + p % 64, -1 padding).
* DeepseekSparseAttnBackend._forward_flashmla_kv (fp8 cache) / _forward_flashmla_sparse (bf16 cache):
  FlashMLA's sparse decode -> pdserve::sparse_mla_decode, with the launcher's kernel choice (one table,
  SparseMlaDecode.make_plan): exact on the fp32 amax/448 tile scales of V3.2 FP8 caches, unless the deployment
  opted into the lossy path ($PDSERVE_DSA_LOSSY_BF16_DEQUANT=1, Runtime.lossy_bf16_dequant).
* DeepSeek V4 (DeepseekV4AttnBackend, SGLang's dsv4 backend): v4_hooks.py, as Runtime.v4.

Nothing here syncs the host, and what is allocated per call (the ops' outputs, the slot mapping's intermediates,
the padding rows) comes from the stream's allocator, or the graph's pool under capture; a plan's workspace is
made once per shape. So the hooks run inside SGLang's decode CUDA graphs.
"""

from __future__ import annotations

import sys
import threading
from importlib import metadata as importlib_metadata

from . import decide as decision
from .plans import PlanCache
from .record import Recorder
from .status import PDSERVE, FallbackLog, RanLog, Status, all_sglang, batchless, guarded_on_backend, log_status
from .v4_hooks import V4Hooks

PAGE = decision.PAGE
# The sparse MLA layout these hooks serve: DeepSeek V3.2's (fp8 cache, or bf16 with bf16_kv). V4's dsv4 backend has
# its own hooks (v4_hooks.py), which plan layout "v4".
MLA_LAYOUT = "v32"
OFF_REASON = "not requested (PDSERVE_DSA_KERNELS is not 'pdserve')"

def _version(dist: str) -> str | None:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def physical_slots(positions, page_table, page: int = PAGE):
    """Positions within each request (-1 = none) -> physical KV slots through the request's page table."""
    import torch

    valid = positions >= 0
    p = positions.clamp_min(0)
    pages = torch.gather(page_table, 1, torch.div(p, page, rounding_mode="floor").long())
    slots = pages * page + p % page
    return slots.masked_fill_(~valid, -1)


class Runtime:
    """The plugin's state in one scheduler process."""

    def __init__(self, requested: str, record_dir: str | None = None, lossy_bf16_dequant: bool = False) -> None:
        self.requested = requested
        # The faster lossy sparse MLA path (V3.2 FP8: e4m3 x scale rounded to bf16), an explicit opt-in.
        self.lossy_bf16_dequant = lossy_bf16_dequant
        self.kernels: dict[int, dict[str, str]] = {}  # device index -> op -> kernel
        self.index_ceiling: dict[int, int | None] = {}  # device index -> the longest indexer row (plans.py)
        self.plans = PlanCache()
        self.fallbacks = FallbackLog()
        self.ran = RanLog()
        self.recorder = Recorder(record_dir) if record_dir else None
        self._decode = threading.local()
        self.v4 = V4Hooks(self)  # DeepSeek V4's dsv4 backend

    # ---- once per backend ----
    def on_backend(self, backend, model_runner) -> Status:
        import torch

        device = torch.device(backend.device) if not isinstance(backend.device, torch.device) else backend.device
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        major, minor = torch.cuda.get_device_capability(device)
        where = {"tp_rank": _tp_rank(model_runner), "device": str(device), "sm": f"{major}.{minor}",
                 "sglang": _version("sglang"), "pdserve_kernels": _version("pdserve-kernels"), "model": "deepseek_v32"}
        if self.requested != PDSERVE:
            status = all_sglang(self.requested, OFF_REASON, **where)
        else:
            facts = decision.BackendFacts(
                capability=(major, minor), page_size=page_size(backend),
                index_kpool=int(getattr(backend, "dsa_index_kpool", 1) or 1),
                decode_impl=str(getattr(backend, "dsa_decode_impl", "")),
                kv_store_fp8=bool(getattr(backend, "dsa_kv_cache_store_fp8", False)),
                kv_cache_dim=int(getattr(backend, "kv_cache_dim", 0)),
                fused_topk=bool(getattr(backend, "use_fused_topk", False)),
                index_topk=int(getattr(backend, "dsa_index_topk", 0) or 0),
                modules_error=_load_modules(device) if (major, minor) in decision.SUPPORTED_SM else None)
            kernels, reasons = decision.decide(facts)
            self.index_ceiling[device.index] = index_ceiling(backend, facts.page_size)
            status = Status(requested=self.requested, kernels=kernels, reasons=reasons,
                            lossy_bf16_dequant=self.lossy_bf16_dequant, **where)
            self.kernels[device.index] = kernels
        log_status(status)
        return status

    def serves(self, op: str, device) -> bool:
        return self.kernels.get(device.index, {}).get(op) == PDSERVE

    def in_decode(self) -> bool:
        return getattr(self._decode, "depth", 0) > 0

    def fallback(self, op: str, reason: str, shape) -> None:
        self.fallbacks.note(op, reason, str(shape))

    # ---- the hooks (installed by sglang_plugin.load) ----
    def backend_init(self, original, backend, model_runner, *args, **kwargs):
        original(backend, model_runner, *args, **kwargs)
        guarded_on_backend(self.on_backend, backend, model_runner)

    def forward_decode(self, original, *args, **kwargs):
        self._decode.depth = getattr(self._decode, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            self._decode.depth -= 1

    def indexer_topk(self, original, indexer, forward_batch, layer_id, q_fp8, weights, metadata):
        args = (indexer, forward_batch, layer_id, q_fp8, weights, metadata)
        if not self.serves("indexer_topk", q_fp8.device) or not forward_batch.forward_mode.is_decode():
            return original(*args)
        why = _indexer_refusal(indexer, metadata, q_fp8, weights)
        if why:
            self.fallback("indexer_topk", why, tuple(q_fp8.shape))
            return original(*args)
        try:
            result, lengths = self._indexer_topk(indexer, layer_id, q_fp8, weights, metadata)
        except ValueError as e:  # the op refuses before launching anything: SGLang's kernel takes the call
            self.fallback("indexer_topk", str(e), tuple(q_fp8.shape))
            return original(*args)
        self.ran.note("indexer_topk", str(tuple(q_fp8.shape)))
        if self.recorder is not None and self.recorder.active():
            self.recorder.topk(layer_id, result, original(*args), lengths)
        return result

    def _indexer_topk(self, indexer, layer_id, q_fp8, weights, metadata):
        import torch

        lengths = metadata.get_seqlens_int32()
        table = metadata.get_page_table_64()
        batch = lengths.shape[0]
        pool = sys.modules[type(indexer).__module__].get_token_to_kv_pool()
        cache = indexer._get_index_k_read_buffer(pool, layer_id)
        cache = cache.view(cache.shape[0], PAGE, 1, cache.shape[-1] // PAGE)
        plan = self.plans.indexer(q_fp8.device, batch, int(indexer.index_topk), table.shape[1] * PAGE, table.shape[1],
                                  ceiling=self.index_ceiling.get(q_fp8.device.index))
        gates = weights[:batch, :, 0] if weights.dim() == 3 else weights[:batch]
        positions = plan(q_fp8[:batch].unsqueeze(1), gates, cache, lengths, table)
        slots = physical_slots(positions, table)
        if q_fp8.shape[0] > batch:  # rows SGLang padded (attention TP, graph padding) select nothing
            pad = slots.new_full((q_fp8.shape[0] - batch, slots.shape[1]), -1)
            slots = torch.cat([slots, pad], dim=0)
        return slots, lengths

    def mla_fp8(self, original, backend, q_all, kv_cache, v_head_dim, sm_scale, layer, metadata, page_table_1):
        kwargs = {"q_all": q_all, "kv_cache": kv_cache, "v_head_dim": v_head_dim, "sm_scale": sm_scale, "layer": layer,
                  "metadata": metadata, "page_table_1": page_table_1}
        if not self.in_decode() or not self.serves("sparse_mla_decode", q_all.device):
            return original(backend, **kwargs)
        q = q_all.view(-1, 1, layer.tp_q_head_num, layer.head_dim)
        page = page_size(backend)
        cache = kv_cache.view(-1, page, 1, backend.kv_cache_dim)
        return self._mla(original, backend, kwargs, "fp8", q, cache, page_table_1, v_head_dim, sm_scale,
                        bf16_kv=False, page=page)

    def mla_bf16(self, original, backend, q_all, kv_cache, v_head_dim, page_table_1, sm_scale, topk_length=None,
                 **more):
        kwargs = dict(q_all=q_all, kv_cache=kv_cache, v_head_dim=v_head_dim, page_table_1=page_table_1,
                      sm_scale=sm_scale, topk_length=topk_length, **more)
        if not self.in_decode() or not self.serves("sparse_mla_decode", q_all.device):
            return original(backend, **kwargs)
        if any(v is not None for v in more.values()):  # e.g. attn_sink (newer SGLang): not a V3.2 input
            given = sorted(k for k, v in more.items() if v is not None)
            self.fallback("sparse_mla_decode", f"unsupported inputs {given}", tuple(q_all.shape))
            return original(backend, **kwargs)
        return self._mla(original, backend, kwargs, "bf16", q_all, kv_cache, page_table_1, v_head_dim, sm_scale,
                         bf16_kv=True, page=kv_cache.shape[1] if kv_cache.dim() >= 3 else 1)

    def _mla(self, original, backend, kwargs, variant, q, cache, page_table_1, v_head_dim, sm_scale, *, bf16_kv,
             page):
        shape = (variant, tuple(q.shape))
        if v_head_dim != 512:
            self.fallback("sparse_mla_decode", f"v_head_dim {v_head_dim} (the kernels write 512)", shape)
            return original(backend, **kwargs)
        indices = page_table_1.unsqueeze(1) if page_table_1.dim() == 2 else page_table_1
        rows, h = q.shape[0] * (q.shape[1] if q.dim() == 4 else 1), q.shape[-2]
        try:
            plan = self.plans.mla(q.device, MLA_LAYOUT, rows, h, indices.shape[-1], bf16_kv=bf16_kv, page=page,
                                  lossy_bf16_dequant=self.lossy_bf16_dequant)
            out, _lse = plan(q, cache, indices, sm_scale)
        except ValueError as e:
            self.fallback("sparse_mla_decode", str(e), shape)
            return original(backend, **kwargs)
        self.ran.note("sparse_mla_decode", str(shape))
        if self.recorder is not None and self.recorder.active():
            self.recorder.attention(getattr(kwargs.get("layer"), "layer_id", -1), variant, out,
                                    original(backend, **kwargs),
                                    exact=_exact_attention(q, cache, indices, sm_scale, bf16_kv=bf16_kv, page=page))
        return out


def _exact_attention(q, cache, indices, sm_scale, *, bf16_kv: bool, page: int):
    """The fp32 reference (sparse_mla_reference) of the first rows, read from the same cache bytes."""
    import torch

    from pdserve_kernels.sparse_mla_reference import LAYOUTS, reference_decode

    from .record import EXACT_ROWS

    layout = LAYOUTS["v32_bf16" if bf16_kv else "v32"]
    h = q.shape[-2]
    rows = q.reshape(-1, h, q.shape[-1])[:EXACT_ROWS]
    n = rows.shape[0]
    # The reference reads raw bytes per block: SGLang's pool is packed, page entries per block.
    blocks = cache.reshape(cache.shape[0], -1).view(torch.uint8).reshape(-1, page * layout.entry_bytes)
    o, _ = reference_decode(layout, rows, blocks, page, indices.reshape(-1, indices.shape[-1])[:n], float(sm_scale))
    return o


def page_size(backend) -> int:
    """The DSA backend's KV page size in tokens, 0 if it names none: SGLang 0.5.17 keeps it as `real_page_size`,
    0.5.23 as `physical_page_size` (the server's page size over the index key pool, dsa_index_kpool)."""
    for name in ("physical_page_size", "real_page_size"):
        value = getattr(backend, name, None)
        if isinstance(value, int):
            return value
    return 0


def index_ceiling(backend, tokens_per_page: int) -> int | None:
    """The longest row an indexer call of this backend can have, in index positions (64 per page of the index
    cache, which holds `tokens_per_page` tokens: 64 on V3.2, 256 on V4's C4 layers): SGLang's request table's width
    (its context length plus a few spare tokens) in pages. Its decode CUDA graphs are captured at that width. None
    where the backend does not say."""
    shape = tuple(getattr(getattr(backend, "req_to_token", None), "shape", ()))
    if len(shape) != 2 or shape[1] < 1 or not isinstance(tokens_per_page, int) or tokens_per_page < 1:
        return None
    return -(-int(shape[1]) // tokens_per_page) * PAGE


def _tp_rank(model_runner):
    """The runner's tensor-parallel rank (SGLang 0.5.17 keeps it in model_runner.ps)."""
    for holder in (model_runner, getattr(model_runner, "ps", None)):
        rank = getattr(holder, "tp_rank", None)
        if isinstance(rank, int):
            return rank
    return None


def _load_modules(device) -> str | None:
    """Load both fatbins on `device` now, outside any CUDA-graph capture; the error text if they cannot be."""
    from pdserve_kernels import ops

    try:
        ops.indexer_for(device)
        ops.mla_for(device)
    except Exception as e:  # noqa: BLE001 - any load failure is a fallback reason, said once
        return f"{type(e).__name__}: {e}"
    return None


def _indexer_refusal(indexer, metadata, q_fp8, weights) -> str | None:
    """Why this indexer call is not one the fused kernel computes the same as SGLang, if it is not."""
    if getattr(indexer, "num_init_tokens", 0) or getattr(indexer, "num_local_tokens", 0):
        return "index_init_tokens / index_local_tokens force extra positions, which the kernel does not"
    if getattr(metadata, "force_unfused_topk", False):
        return "this batch asks for SGLang's unfused top-k (raw positions)"
    method = getattr(getattr(metadata, "topk_transform_method", None), "name", "PAGED")
    if method != "PAGED":
        return f"top-k transform {method} (only PAGED, physical slots, is replaced)"
    if q_fp8.dim() != 3 or tuple(q_fp8.shape[1:]) != (decision.INDEX_HEADS, decision.INDEX_DIM):
        return f"indexer q of shape {batchless(q_fp8.shape)} (the kernel takes 64 heads x 128)"
    if metadata.get_seqlens_int32().dim() != 1:
        return "per-token lengths (speculative decoding)"
    return None
