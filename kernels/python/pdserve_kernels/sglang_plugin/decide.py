"""Which ops the plugin takes over in one SGLang DSA backend, decided once when the backend is built, from
what the backend was configured with. Pure: the facts come in as a BackendFacts, no torch or SGLang here.

The rules follow what the kernels implement and what SGLang's call sites hand over (../shared/facts/
sglang-dsa.md, §5): the indexer replaces DeepGEMM's paged logits + SGLang's fused top-k (which writes
physical KV slots, SGLANG_DSA_FUSE_TOPK); sparse MLA decode replaces FlashMLA's fp8 decode kernel
(`flashmla_kv`) and its sparse bf16 kernel (`flashmla_sparse`) on decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from .status import OPS, PDSERVE, SGLANG

# The fatbins carry sm_90a and sm_120a cubins; the "a" targets run on exactly that architecture.
SUPPORTED_SM = ((9, 0), (12, 0))
INDEX_HEADS, INDEX_DIM, PAGE = 64, 128, 64
MLA_DECODE_IMPLS = ("flashmla_kv", "flashmla_sparse")


@dataclass(frozen=True)
class BackendFacts:
    capability: tuple[int, int]
    page_size: int
    decode_impl: str
    kv_store_fp8: bool
    kv_cache_dim: int
    fused_topk: bool  # SGLang's fused top-k: attention reads physical slots straight from the top-k
    index_topk: int
    modules_error: str | None = None  # why the fatbins could not be loaded on this device, if they could not
    index_kpool: int = 1  # SGLang 0.5.23: index keys pooled over this many tokens (the model's index_kpool)


def decide(facts: BackendFacts) -> tuple[dict[str, str], dict[str, str]]:
    """(kernel per op, reason per op served by SGLang)."""
    reasons: dict[str, str] = {}
    common = _common_reason(facts)
    if common:
        reasons = dict.fromkeys(OPS, common)
    else:
        indexer = []
        if not facts.fused_topk:
            indexer.append("SGLang's fused top-k is off (SGLANG_DSA_FUSE_TOPK=0, or IndexShare under PD): attention "
                           "then expects raw positions, which this plugin does not produce")
        if facts.index_topk < 1:
            indexer.append(f"index_topk {facts.index_topk} is not a positive top-k")
        if indexer:
            reasons["indexer_topk"] = "; ".join(indexer)
        mla = _mla_reason(facts)
        if mla:
            reasons["sparse_mla_decode"] = mla
    return {op: (SGLANG if op in reasons else PDSERVE) for op in OPS}, reasons


def _common_reason(facts: BackendFacts) -> str | None:
    if facts.index_kpool != 1:
        return (f"index_kpool {facts.index_kpool}: SGLang pools the index keys over tokens, the kernels score one "
                "key per token")
    return _gpu_page_modules_reason(facts.capability, facts.page_size, PAGE, "the kernels read 64-token pages",
                                    facts.modules_error)


def _gpu_page_modules_reason(capability: tuple[int, int], page_size: int, page: int, page_rule: str,
                             modules_error: str | None) -> str | None:
    """Why no op of a backend can take the kernels (V3.2's and V4's alike): the GPU, the page size, the modules."""
    if capability not in SUPPORTED_SM:
        major, minor = capability
        return f"sm_{major}{minor} GPU: the kernels are built for sm_90a and sm_120a only"
    if page_size != page:
        return f"page size {page_size}: {page_rule}"
    if modules_error:
        return f"the kernels could not be loaded: {modules_error}"
    return None


def _mla_reason(facts: BackendFacts) -> str | None:
    if facts.decode_impl not in MLA_DECODE_IMPLS:
        return (f"decode backend {facts.decode_impl!r} is not replaced (only {', '.join(MLA_DECODE_IMPLS)}: "
                "set --dsa-decode-backend)")
    if facts.decode_impl == "flashmla_kv" and not facts.kv_store_fp8:
        return "flashmla_kv over a bf16 cache (SGLang quantizes the whole cache per call): not replaced"
    expected = 656 if facts.decode_impl == "flashmla_kv" else 576
    if facts.kv_cache_dim != expected:
        return (f"MLA cache entry of {facts.kv_cache_dim} {'bytes' if expected == 656 else 'values'}, expected "
                f"{expected} (DeepSeek V3.2's 512 + 64 latent)")
    return None


# ---- DeepSeek V4 (SGLang's dsv4 backend) ----

V4_PAGE = 256  # SGLang's V4 pages: 256 tokens (asserted by its backend); the C4 index cache's blocks are 64 entries
V4_INDEX_TOPK = (512, 1024)


@dataclass(frozen=True)
class V4Facts:
    capability: tuple[int, int]
    page_size: int
    index_topk: int
    fp4_indexer: bool = False  # --enable-deepseek-v4-fp4-indexer: 68-byte index entries, DeepGEMM's fp8 x fp4 logits
    v41: bool = False          # DeepSeek V4.1 (SGLang 0.5.23): other cache layouts and compress ratios 1 and 2
    trtllm: bool = False       # SGLang 0.5.23's uniform-FP8 pool, readable only by trtllm-gen
    modules_error: str | None = None


def decide_v4(facts: V4Facts) -> tuple[dict[str, str], dict[str, str]]:
    """(kernel per op, reason per op served by SGLang) for one DeepseekV4AttnBackend. Per-call conditions (heads
    padded under TP, cache entry size, page sizes) are the hooks' (v4_hooks.py): they fall back call by call."""
    reasons: dict[str, str] = {}
    common = _v4_common_reason(facts)
    if common:
        return dict.fromkeys(OPS, SGLANG), dict.fromkeys(OPS, common)
    if facts.v41 or facts.trtllm:
        layout = "DeepSeek V4.1's cache layouts" if facts.v41 else "the trtllm-gen uniform-FP8 pool"
        reasons = dict.fromkeys(OPS, layout + ": not a layout the kernels read")
    if facts.fp4_indexer:
        reasons["indexer_topk"] = "the FP4 indexer (--enable-deepseek-v4-fp4-indexer): the kernel reads FP8 index keys"
    elif facts.index_topk not in V4_INDEX_TOPK:
        reasons["indexer_topk"] = f"index_topk {facts.index_topk} (V4's are {V4_INDEX_TOPK})"
    return {op: (SGLANG if op in reasons else PDSERVE) for op in OPS}, reasons


def _v4_common_reason(facts: V4Facts) -> str | None:
    return _gpu_page_modules_reason(facts.capability, facts.page_size, V4_PAGE,
                                    "SGLang's V4 backend pages 256 tokens", facts.modules_error)
