"""PyTorch reference for the DSA indexer, written from the equations, and the shared input generator.

I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q[t, h] . k[s]) over s < len(t); then top-k.
Nothing here is fast; it is what the kernel is checked and timed against.
"""

from __future__ import annotations

import math

HEADS, DIM, PAGE = 64, 128, 64
BLOCK_BYTES = PAGE * (DIM + 4)
KEY_BYTES = PAGE * DIM
NAN_F32 = 0x7FC00000   # fp32 quiet NaN, as int32 bits
NAN_E4M3 = 0x7F        # e4m3 NaN byte


def token_lengths(torch, context_lens, next_n: int):
    """[B, next_n] int64 lengths under the launcher's convention (DeepGEMM's causal rule for [B])."""
    if context_lens.dim() == 1:
        j = torch.arange(next_n, device=context_lens.device)
        return (context_lens.long()[:, None] - next_n + 1 + j[None, :]).clamp_min(0)
    return context_lens.long().clamp_min(0)


def _blocks(torch, kv_cache):
    return kv_cache.view(torch.uint8).reshape(-1, BLOCK_BYTES)


def reference_scores(q, weights, kv_cache, context_lens, block_table, dtype=None, with_magnitude=False):
    """Per row (b * next_n + j) a 1-D tensor of the len(row) scores, computed in `dtype` (default fp64).

    With `with_magnitude`, also per row k_scale[s] * sum_h |w[h]| * sum_d |q[h, d] k[s, d]|: the size of
    the terms summed, which bounds rounding error (a score can cancel to far below it).
    """
    import torch

    dtype = dtype or torch.float64
    B, next_n = q.shape[0], q.shape[1]
    lens = token_lengths(torch, context_lens, next_n).tolist()
    blocks = _blocks(torch, kv_cache)
    qf = q.view(torch.float8_e4m3fn).to(dtype)
    w = weights.to(dtype).view(B, next_n, HEADS)
    out, mags = [], []
    for b in range(B):
        maxlen = max(lens[b])
        n = math.ceil(maxlen / PAGE)
        blk = blocks[block_table[b, :n].long()]
        keys = blk[:, :KEY_BYTES].contiguous().view(torch.float8_e4m3fn).reshape(n * PAGE, DIM)
        scale = blk[:, KEY_BYTES:].contiguous().view(torch.float32).reshape(n * PAGE)
        keys, scale = keys[:maxlen].to(dtype), scale[:maxlen].to(dtype)
        for j in range(next_n):
            L = lens[b][j]
            dots = qf[b, j] @ keys[:L].T                       # [64, L]
            s = (w[b, j][:, None] * dots.relu()).sum(0) * scale[:L]
            out.append(s)
            if with_magnitude:
                absdots = qf[b, j].abs() @ keys[:L].abs().T
                mags.append((w[b, j].abs()[:, None] * absdots).sum(0) * scale[:L])
    return (out, mags) if with_magnitude else out


def reference_topk_naive(q, weights, kv_cache, context_lens, block_table, topk: int, max_context: int):
    """The straightforward implementation: logits over max_context (masked to -inf), then torch.topk.

    This is the cost model of the public O(max_context) bug; the benchmark times it as "the PyTorch
    reference". Returns int32 [rows, topk] with -1 where a row has fewer than topk positions.
    """
    import torch

    B, next_n = q.shape[0], q.shape[1]
    lens = token_lengths(torch, context_lens, next_n)
    blocks = _blocks(torch, kv_cache)
    n = max_context // PAGE
    qf = q.view(torch.float8_e4m3fn).float()
    logits = torch.empty((B, next_n, max_context), dtype=torch.float32, device=q.device)
    for b in range(B):
        blk = blocks[block_table[b, :n].long()]
        keys = blk[:, :KEY_BYTES].contiguous().view(torch.float8_e4m3fn).reshape(n * PAGE, DIM).float()
        scale = blk[:, KEY_BYTES:].contiguous().view(torch.float32).reshape(n * PAGE)
        dots = torch.einsum("jhd,sd->jhs", qf[b], keys)
        logits[b] = (weights.view(B, next_n, HEADS)[b][:, :, None] * dots.relu()).sum(1) * scale
    pos = torch.arange(max_context, device=q.device)
    logits = logits.masked_fill(pos[None, None, :] >= lens[:, :, None], float("-inf")).view(B * next_n, -1)
    k = min(topk, max_context)
    vals, idx = torch.topk(logits, k, dim=-1)
    idx = idx.int().masked_fill(vals == float("-inf"), -1)
    if k < topk:
        idx = torch.cat([idx, idx.new_full((B * next_n, topk - k), -1)], dim=1)
    return idx


def make_inputs(B: int, next_n: int, lens, *, max_blocks: int | None = None, device="cuda", generator=None,
                explicit_lens: bool = False, poison: bool = True, spare_blocks: int = 2):
    """Random inputs in the kernel's layout. `lens[b]` is request b's context length.

    Pages are scattered over a shuffled pool. With `poison`, every key byte and scale beyond each
    request's length, every spare pool block and every unused block-table entry's target hold NaN, so a
    kernel reading outside the lengths produces NaN.
    Returns dict(q, weights, kv_cache, context_lens, block_table).
    """
    import torch

    lens = [int(x) for x in lens]
    pages = [math.ceil(x / PAGE) for x in lens]
    if max_blocks is None:
        max_blocks = max(1, max(pages))
    total = sum(pages)
    pool = total + spare_blocks
    kv = torch.empty((pool, BLOCK_BYTES), dtype=torch.uint8, device=device)
    step = 1 << 16
    for lo in range(0, pool, step):
        hi = min(pool, lo + step)
        keys = torch.randn((hi - lo, KEY_BYTES), device=device, generator=generator).to(torch.float8_e4m3fn)
        kv[lo:hi, :KEY_BYTES] = keys.view(torch.uint8)
        sc = torch.rand((hi - lo, PAGE), device=device, generator=generator) * 0.03 + 0.005
        kv[lo:hi, KEY_BYTES:] = sc.view(torch.uint8).view(hi - lo, PAGE * 4)
    perm = torch.randperm(pool, device=device, generator=generator).int()
    used, spare = perm[:total], perm[total:]
    poison_block = int(spare[0]) if (poison and spare_blocks) else 0
    bt = torch.full((B, max_blocks), poison_block, dtype=torch.int32, device=device)
    off = 0
    for b in range(B):
        bt[b, :pages[b]] = used[off:off + pages[b]]
        off += pages[b]
    if poison:
        kv[spare.long()] = NAN_E4M3
        if spare_blocks:
            kv[spare.long(), KEY_BYTES:] = torch.tensor([NAN_F32], dtype=torch.int32, device=device).view(
                torch.uint8).repeat(PAGE)
        for b in range(B):
            tail = pages[b] * PAGE - lens[b]
            if pages[b] and tail:
                blk = int(bt[b, pages[b] - 1])
                first = PAGE - tail
                kv[blk, first * DIM:KEY_BYTES] = NAN_E4M3
                kv[blk, KEY_BYTES + 4 * first:] = torch.tensor([NAN_F32], dtype=torch.int32, device=device).view(
                    torch.uint8).repeat(tail)
    q = torch.randn((B, next_n, HEADS, DIM), device=device, generator=generator).to(torch.float8_e4m3fn)
    weights = torch.randn((B * next_n, HEADS), device=device, generator=generator) / 8
    cl = torch.tensor(lens, dtype=torch.int32, device=device)
    if explicit_lens:
        j = torch.arange(next_n, device=device, dtype=torch.int32)
        cl = (cl[:, None] - next_n + 1 + j[None, :]).clamp_min(0).int().contiguous()
    return {"q": q, "weights": weights, "kv_cache": kv.view(pool, PAGE, 1, DIM + 4), "context_lens": cl,
            "block_table": bt}
