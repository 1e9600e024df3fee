"""FlashMLA's sparse decode on the decode benchmark's inputs, for a same-process comparison.

Written against deepseek-ai/FlashMLA commit 9241ae3ef9bac614dd25e45e507e089f888280e0 (2026-04-29), the one
facts/kernels.md measured; it uses only the public `flash_mla.get_mla_metadata` and
`flash_mla.flash_mla_with_kvcache`. Our inputs already have FlashMLA's shapes and byte layouts
(sparse_mla_reference.py): q bf16 [B, 1, h, d_qk], kv uint8 [blocks, page, 1, 584 or 656] with padded block
strides, indices int32 [B, 1, topk] (physical_block * page + offset), the window cache and its indices as the
"extra" source, sinks fp32 [h]. FlashMLA picks V3.2 or V4 (its MODEL1) from d_qk (576 or 512).
"""

from __future__ import annotations

FLASHMLA_COMMIT = "9241ae3ef9bac614dd25e45e507e089f888280e0"


def load():
    """(flash_mla module, None) when importable, else (None, why not)."""
    try:
        import flash_mla

        return flash_mla, None
    except Exception as e:  # noqa: BLE001 - ImportError, or a missing/mismatched CUDA extension
        return None, f"{type(e).__name__}: {e}"


def padded_heads(h: int) -> int | None:
    """The head count FlashMLA's Hopper decode runs for h heads (it takes only 64 or 128), None if none."""
    return 64 if h <= 64 else 128 if h <= 128 else None


class FlashMlaDecode:
    """One shape's FlashMLA call, ready to time: `self()` returns out bf16 [B, 1, h, 512] (padding dropped).

    Heads below 64 are zero-padded to 64 (q zeros, sinks zeros); the padded heads' outputs are dropped, but
    FlashMLA does their work, as a TP4/TP8 caller would have it do.

    Construction makes the first call, which also builds FlashMLA's tile schedule (its get_mla_metadata
    returns an empty object that the first flash_mla_with_kvcache call fills). Later calls reuse it, as a
    server reuses one schedule for every layer of a decode step, so the timed calls exclude the schedule.
    """

    def __init__(self, fm, q, kv, indices, sm_scale: float, sinks=None, extra_kv=None, extra_indices=None):
        import torch

        B, s_q, h, dqk = q.shape
        hp = padded_heads(h)
        if hp is None:
            raise ValueError(f"FlashMLA sparse decode takes 64 or 128 heads; {h} cannot be padded to either")
        self.h, self.heads = h, hp
        if hp != h:
            qp = torch.zeros((B, s_q, hp, dqk), dtype=q.dtype, device=q.device)
            qp[:, :, :h] = q
            q = qp
            if sinks is not None:
                sp = torch.zeros((hp,), dtype=torch.float32, device=sinks.device)
                sp[:h] = sinks
                sinks = sp
        self.fm = fm
        self.sched, _ = fm.get_mla_metadata()
        self.kw = {
            "q": q, "k_cache": kv, "block_table": None, "cache_seqlens": None, "head_dim_v": 512,
            "tile_scheduler_metadata": self.sched, "softmax_scale": sm_scale, "is_fp8_kvcache": True,
            "indices": indices, "attn_sink": None if sinks is None else sinks.float().contiguous(),
            "extra_k_cache": extra_kv, "extra_indices_in_kvcache": extra_indices}
        self.first = self()
        torch.cuda.synchronize()   # an error of the first call surfaces here, inside the caller's try

    def __call__(self):
        out, _lse = self.fm.flash_mla_with_kvcache(**self.kw)
        return out[:, :, :self.h]
