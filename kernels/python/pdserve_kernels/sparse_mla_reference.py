"""Sparse MLA decode: PyTorch reference from the equations, cache packing, and the test/benchmark inputs.

Equations (per query row r, head h, valid selected entries e):
  s[h, e] = sm_scale * q[r, h] . k[e]
  lse[h]  = log sum_e exp(s[h, e])                    (natural log; +inf when no entry is valid)
  o[h]    = sum_e exp(s[h, e] - lse[h]) v[e] / (1 + exp(sink[h] - lse[h]))   (0 when no entry is valid)
with v[e] = k[e, :512]. Dequantized values are exact (e4m3 times a power of two), so the reference
computes in fp32 on the dequantized cache read back from the packed bytes.

Layouts (FlashMLA's, so callers can swap kernels):
* "v4"  (MODEL1_FP8Sparse, 584 B/entry): per block, page x [448 e4m3 | 64 bf16 RoPE] (576 B), then
  page x [7 UE8M0 scales | 1 pad] (8 B); block stride padded to a multiple of 576 B.
* "v32" (V32_FP8Sparse, 656 B/entry): per entry [512 e4m3 | 4 fp32 scales | 64 bf16 RoPE]; block stride
  (page + 1) x 656 B.
* "v4_bf16" / "v32_bf16" (bf16 KV): per entry d_qk contiguous bf16 values (1024 / 1152 B), no scales; the
  test caches pad each block by one entry so the block stride differs from page x entry bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DV = 512
NAN_BYTE = 0xFF   # e4m3fn NaN, UE8M0 NaN, and bf16 / fp32 NaN when repeated


@dataclass(frozen=True)
class Layout:
    name: str
    dqk: int          # dims of q and k
    nope: int         # e4m3 dims
    group: int        # dims per scale
    entry_bytes: int  # bytes per entry counted as traffic (data + scales)
    bf16: bool = False  # bf16 KV (no quantization)

    @property
    def groups(self) -> int:
        return self.nope // self.group

    def block_stride(self, page: int) -> int:
        if self.bf16:
            return (page + 1) * self.entry_bytes
        if self.name == "v4":
            return math.ceil(page * self.entry_bytes / 576) * 576
        return (page + 1) * self.entry_bytes


LAYOUTS = {
    "v4": Layout("v4", dqk=512, nope=448, group=64, entry_bytes=584),
    "v32": Layout("v32", dqk=576, nope=512, group=128, entry_bytes=656),
    "v4_bf16": Layout("v4_bf16", dqk=512, nope=448, group=64, entry_bytes=1024, bf16=True),
    "v32_bf16": Layout("v32_bf16", dqk=576, nope=512, group=128, entry_bytes=1152, bf16=True),
}


def quantize(torch, layout: Layout, values):
    """bf16/fp32 [n, dqk] -> (e4m3 [n, nope], scale exponents int [n, groups], rope bf16 [n, 64]).

    Scale per group = 2^ceil(log2(amax / 448)) (UE8M0-representable), as FlashMLA's quantizer does.
    """
    v = values.float()
    nope = v[:, :layout.nope].reshape(-1, layout.groups, layout.group)
    amax = nope.abs().amax(-1).clamp_min(1e-4 * 448)
    exp = torch.ceil(torch.log2(amax / 448.0))
    q8 = (nope / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).reshape(-1, layout.nope)
    rope = values[:, layout.nope:].to(torch.bfloat16)
    return q8, exp.to(torch.int32), rope


def quantize_amax448(torch, layout: Layout, values):
    """V3.2's cache as SGLang 0.5.17 writes it (quantize_k_cache_separate, ../shared/facts/sglang-dsa.md 5.1):
    per 128-value tile an fp32 scale amax/448 (not a power of two, no epsilon), e4m3 = value / scale.
    Returns (e4m3 [n, 512], fp32 scales [n, 4], rope bf16 [n, 64])."""
    v = values.float()
    nope = v[:, :layout.nope].reshape(-1, layout.groups, layout.group)
    scale = (nope.abs().amax(-1) / 448.0).clamp_min(torch.finfo(torch.float32).tiny)
    q8 = (nope / scale[..., None]).to(torch.float8_e4m3fn).reshape(-1, layout.nope)
    return q8, scale, values[:, layout.nope:].to(torch.bfloat16)


def write_entries(torch, layout: Layout, cache, page: int, idx, values, scale_factor: float = 1.0,
                  scale_mode: str = "pow2") -> None:
    """Quantize `values` [n, dqk] and store them at entry indices `idx` [n] (int64) of `cache` [nb, stride].

    scale_factor multiplies the stored scales: v32's fp32 ones by any factor (1 + 2^-20 makes them non-powers of
    two, which the kernel's fast conversion does not take: the tests use it to reach the fallback path), v4's UE8M0
    exponents by a power of two (2^20 puts some above what the fast conversion takes). scale_mode
    "amax448" (v32 only): SGLang's own scales (quantize_amax448) instead of powers of two; "mixed" (v32 only):
    powers of two, times 1 + 2^-20 on every other entry (entries on both conversion paths in one tile)."""
    blk, off = idx // page, idx % page
    n = idx.numel()
    u8 = cache
    if layout.bf16:
        data = values.to(torch.bfloat16).contiguous().view(torch.uint8)
        cols = torch.arange(layout.entry_bytes, device=cache.device)
        u8[blk[:, None], (off * layout.entry_bytes)[:, None] + cols[None, :]] = data
        return
    q8, exp, rope = quantize(torch, layout, values)
    if layout.name == "v4":
        data = torch.empty((n, 576), dtype=torch.uint8, device=cache.device)
        data[:, :448] = q8.view(torch.uint8)
        data[:, 448:] = rope.contiguous().view(torch.uint8)
        cols = torch.arange(576, device=cache.device)
        u8[blk[:, None], (off * 576)[:, None] + cols[None, :]] = data
        sc = torch.zeros((n, 8), dtype=torch.uint8, device=cache.device)
        shift = math.log2(scale_factor)
        lo, hi = exp.min().item() + 127 + shift, exp.max().item() + 127 + shift
        if shift != int(shift) or lo < 0 or hi > 254:
            raise ValueError(f"scale_factor {scale_factor}: v4 takes a power of two that keeps the UE8M0 "
                             f"exponents in 0..254 (they would span {lo:g}..{hi:g})")
        sc[:, :7] = (exp + 127 + int(shift)).to(torch.uint8)
        cols8 = torch.arange(8, device=cache.device)
        u8[blk[:, None], (page * 576 + off * 8)[:, None] + cols8[None, :]] = sc
    else:
        scales = torch.exp2(exp.float()) * scale_factor
        if scale_mode == "mixed":
            scales[1::2] *= 1 + 2 ** -20
        if scale_mode == "amax448":
            q8, scales, rope = quantize_amax448(torch, layout, values)
        data = torch.empty((n, 656), dtype=torch.uint8, device=cache.device)
        data[:, :512] = q8.view(torch.uint8)
        data[:, 512:528] = scales.contiguous().view(torch.uint8)
        data[:, 528:] = rope.contiguous().view(torch.uint8)
        cols = torch.arange(656, device=cache.device)
        u8[blk[:, None], (off * 656)[:, None] + cols[None, :]] = data


def read_entries(torch, layout: Layout, cache, page: int, idx):
    """Dequantize entries `idx` [n] (int64, all valid) of `cache` [nb, stride] to fp32 [n, dqk], from the bytes."""
    blk, off = idx // page, idx % page
    if layout.bf16:
        cols = torch.arange(layout.entry_bytes, device=cache.device)
        data = cache[blk[:, None], (off * layout.entry_bytes)[:, None] + cols[None, :]]
        return data.contiguous().view(torch.bfloat16).float()
    if layout.name == "v4":
        cols = torch.arange(576, device=cache.device)
        data = cache[blk[:, None], (off * 576)[:, None] + cols[None, :]]
        cols8 = torch.arange(8, device=cache.device)
        sc = cache[blk[:, None], (page * 576 + off * 8)[:, None] + cols8[None, :]][:, :7]
        scale = torch.exp2(sc.float() - 127)
        nope = data[:, :448].contiguous().view(torch.float8_e4m3fn).float()
        rope = data[:, 448:].contiguous().view(torch.bfloat16).float()
    else:
        cols = torch.arange(656, device=cache.device)
        data = cache[blk[:, None], (off * 656)[:, None] + cols[None, :]]
        scale = data[:, 512:528].contiguous().view(torch.float32)
        nope = data[:, :512].contiguous().view(torch.float8_e4m3fn).float()
        rope = data[:, 528:].contiguous().view(torch.bfloat16).float()
    nope = (nope.view(-1, layout.groups, layout.group) * scale[..., None]).view(-1, layout.nope)
    return torch.cat([nope, rope], dim=1)


def reference_decode(layout: Layout, q, cache, page: int, indices, sm_scale: float, sinks=None,
                     extra_cache=None, extra_page: int | None = None, extra_indices=None):
    """fp32 reference. q [rows, h, dqk] bf16; indices [rows, topk] int32 (-1 invalid); optional extra source.

    Returns (o fp32 [rows, h, 512], lse fp32 [rows, h]).
    """
    import torch

    _rows, _h, _ = q.shape

    def gather(c, pg, ind):
        n_entries = c.shape[0] * pg
        valid = (ind >= 0) & (ind < n_entries)
        safe = torch.where(valid, ind, torch.zeros_like(ind)).long()
        kv = torch.zeros((*ind.shape, layout.dqk), dtype=torch.float32, device=q.device)
        if valid.any():
            kv[valid] = read_entries(torch, layout, c, pg, safe[valid])
        return kv, valid

    kv, valid = gather(cache, page, indices)
    if extra_indices is not None and extra_indices.shape[-1] > 0:
        kv2, valid2 = gather(extra_cache, extra_page, extra_indices)
        kv, valid = torch.cat([kv, kv2], 1), torch.cat([valid, valid2], 1)
    s = torch.einsum("rhd,rnd->rhn", q.float(), kv) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lonely = lse == float("-inf")
    p = torch.exp(s - torch.where(lonely, torch.zeros_like(lse), lse)[..., None])
    o = torch.einsum("rhn,rnd->rhd", p, kv[..., :DV])
    if sinks is not None:
        o = o / (1 + torch.exp(sinks.float()[None, :] - lse))[..., None]
    o = o.masked_fill(lonely[..., None], 0.0)
    lse = lse.masked_fill(lonely, float("inf"))
    return o, lse


def make_cache(torch, layout: Layout, num_blocks: int, page: int, device):
    """A cache of NaN bytes, [num_blocks, block_stride] uint8, plus its kernel-facing 4-D view."""
    stride = layout.block_stride(page)
    buf = torch.full((num_blocks, stride), NAN_BYTE, dtype=torch.uint8, device=device)
    if layout.bf16:
        view = buf.view(torch.bfloat16).as_strided((num_blocks, page, 1, layout.dqk),
                                                   (stride // 2, layout.dqk, layout.dqk, 1))
        return buf, view
    view = buf.as_strided((num_blocks, page, 1, layout.entry_bytes), (stride, layout.entry_bytes,
                                                                       layout.entry_bytes, 1))
    return buf, view


def random_indices(torch, rows: int, topk: int, pool: int, *, invalid_frac: float, device, generator=None,
                   empty_rows=()):
    """[rows, topk] int32 of distinct entries per row in [0, pool), a fraction set to -1, some rows all -1."""
    out = torch.empty((rows, topk), dtype=torch.int32, device=device)
    for r in range(rows):
        out[r] = torch.randperm(pool, device=device, generator=generator)[:topk].int()
    if invalid_frac > 0:
        drop = torch.rand((rows, topk), device=device, generator=generator) < invalid_frac
        out[drop] = -1
    for r in empty_rows:
        out[r] = -1
    return out


def fill_selected(torch, layout: Layout, cache, page: int, indices, *, device, generator=None,
                  scale_factor: float = 1.0, scale_mode: str = "pow2"):
    """Write random quantized entries at every index some row selects; all other entries stay NaN."""
    sel = torch.unique(indices[indices >= 0].long())
    if sel.numel() == 0:
        return
    vals = torch.randn((sel.numel(), layout.dqk), device=device, generator=generator)
    # Spread magnitudes over groups so the scales differ (2^-3 .. 2^3 per group of the NoPE part).
    mag = torch.exp2(torch.randint(-3, 4, (sel.numel(), layout.groups), device=device, generator=generator).float())
    vals[:, :layout.nope] = (vals[:, :layout.nope].view(-1, layout.groups, layout.group) * mag[..., None]).view(
        -1, layout.nope)
    write_entries(torch, layout, cache, page, sel, vals.to(torch.bfloat16), scale_factor, scale_mode)


def make_inputs(layout_name: str, B: int, next_n: int, h: int, topk: int, *, topk_extra: int = 0, page: int = 64,
                pool_entries: int | None = None, invalid_frac: float = 0.1, empty_rows=(), sinks: bool = True,
                device="cuda", generator=None, scale_factor: float = 1.0, scale_mode: str = "pow2",
                extra_page: int | None = None):
    """Random inputs in the kernel's layout, NaN in every cache entry no row selects. The extra source is paged
    by `extra_page` (default: `page`), as SGLang's V4 compressed caches are (64 or 2 beside the window's 256).

    Returns dict(q [B, next_n, h, dqk] bf16, kv, indices [B, next_n, topk], sinks, and for topk_extra > 0
    extra_kv, extra_indices [B, next_n, topk_extra]) plus the raw buffers and pages for the reference.
    """
    import torch

    layout = LAYOUTS[layout_name]
    rows = B * next_n
    pool = pool_entries or max(2 * topk, 4 * page)
    nb = -(-pool // page)
    buf, view = make_cache(torch, layout, nb, page, device)
    ind = random_indices(torch, rows, topk, nb * page, invalid_frac=invalid_frac, device=device,
                         generator=generator, empty_rows=empty_rows)
    fill_selected(torch, layout, buf, page, ind, device=device, generator=generator, scale_factor=scale_factor,
                  scale_mode=scale_mode)
    out = {"layout": layout_name, "kv": view, "kv_buf": buf, "page": page,
           "indices": ind.view(B, next_n, topk)}
    if topk_extra > 0:
        epage = extra_page or page
        epool = max(2 * topk_extra, 4 * epage)
        enb = -(-epool // epage)
        ebuf, eview = make_cache(torch, layout, enb, epage, device)
        eind = random_indices(torch, rows, topk_extra, enb * epage, invalid_frac=invalid_frac, device=device,
                              generator=generator, empty_rows=empty_rows)
        fill_selected(torch, layout, ebuf, epage, eind, device=device, generator=generator,
                      scale_factor=scale_factor, scale_mode=scale_mode)
        out.update(extra_kv=eview, extra_buf=ebuf, extra_page=epage, extra_indices=eind.view(B, next_n, topk_extra))
    out["q"] = torch.randn((B, next_n, h, layout.dqk), device=device, generator=generator).to(torch.bfloat16)
    out["sinks"] = (torch.randn((h,), device=device, generator=generator) * 2) if sinks else None
    return out


def reference_from_inputs(inp, sm_scale: float):
    """Reference (o [B, next_n, h, 512] fp32, lse [B, next_n, h]) for a make_inputs dict."""
    layout = LAYOUTS[inp["layout"]]
    B, next_n, h, dqk = inp["q"].shape
    rows = B * next_n
    extra = "extra_indices" in inp
    o, lse = reference_decode(
        layout, inp["q"].view(rows, h, dqk), inp["kv_buf"], inp["page"], inp["indices"].view(rows, -1), sm_scale,
        inp["sinks"], extra_cache=inp.get("extra_buf"), extra_page=inp["extra_page"] if extra else None,
        extra_indices=inp["extra_indices"].view(rows, -1) if extra else None)
    return o.view(B, next_n, h, DV), lse.view(B, next_n, h)
