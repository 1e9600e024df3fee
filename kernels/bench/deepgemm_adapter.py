"""DeepGEMM's paged indexer logits + masking + torch.topk on the indexer benchmark's inputs: the way SGLang's
DSA indexer selects on Hopper (facts/sglang-dsa.md §1 and §5.2), for a same-process comparison.

Written against `deep_gemm` as shipped in the wheel sgl-deep-gemm 0.1.5.post1 (SGLang 0.5.17's pin; its
prebuilt tvm-ffi `_C.so`, kernels JIT-compiled with the machine's nvcc at first call). It uses only the
public `get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)` and
`fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
clean_logits)`. The benchmark's inputs already have its shapes and layouts: q fp8 e4m3 [B, 1, 64, 128] (no q
scale: it is folded into the weights), key cache uint8 [blocks, 64, 1, 132] (a block's 64 x 128 fp8 keys, then
its 64 fp32 scales), weights fp32 [B, 64], block table int32 [B, max_context / 64]. Context lengths go in as
[B, 1], as SGLang passes them.

DeepGEMM leaves the logits at and beyond each request's length unwritten (clean_logits=False, as SGLang calls
it), so the caller masks them to -inf before the top-k; the logits tensor is sized to max_context.
"""

from __future__ import annotations

DEEPGEMM_DIST = "sgl-deep-gemm 0.1.5.post1"
PAGE = 64


def load():
    """(deep_gemm module, None) when importable, else (None, why not)."""
    try:
        import deep_gemm

        return deep_gemm, None
    except Exception as e:  # noqa: BLE001 - ImportError, a missing shared library, a failed tvm-ffi load
        return None, f"{type(e).__name__}: {e}"


class DeepGemmTopk:
    """One shape's DeepGEMM selection, ready to time: `self()` returns (values, indices) of the top-k of the
    masked logits, indices int64 [B, topk] positions within each request.

    The schedule (get_paged_mqa_logits_metadata) is made here, outside the timed call, as SGLang makes it
    once per decode step before its graph replays. Construction also makes the first call, which JIT-compiles
    DeepGEMM's kernels for this shape class, so timed calls exclude compilation.
    """

    def __init__(self, dg, q, weights, kv, context_lens, block_table, topk: int, num_sms: int):
        import torch

        B = q.shape[0]
        self.dg, self.torch = dg, torch
        self.q, self.weights, self.kv, self.block_table, self.topk = q, weights, kv, block_table, topk
        self.lens = context_lens.view(B, 1).to(torch.int32).contiguous()
        self.max_context = block_table.shape[1] * PAGE
        self.meta = dg.get_paged_mqa_logits_metadata(self.lens, PAGE, num_sms)
        self.pos = torch.arange(self.max_context, device=q.device)
        self.first = self()
        if q.is_cuda:
            torch.cuda.synchronize()   # an error of the first call surfaces here, inside the caller's try

    def logits(self):
        """DeepGEMM's raw logits [B, max_context] fp32 (garbage at and beyond each length)."""
        return self.dg.fp8_paged_mqa_logits(self.q, self.kv, self.weights, self.lens, self.block_table, self.meta,
                                            self.max_context, False)

    def __call__(self):
        logits = self.logits().masked_fill(self.pos[None, :] >= self.lens, float("-inf"))
        return self.torch.topk(logits, self.topk, dim=-1)
