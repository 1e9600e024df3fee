"""CPU check of the reference's SGLang-style V3.2 quantizer (scale_mode "amax448"; the accuracy measurement
kernels/bench/accuracy_amax448.py writes its caches with it): fp32 scales amax/448 per 128-value tile, stored
in the 656-byte entry where the kernels read them, and read back to within e4m3's rounding."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from pdserve_kernels.sparse_mla_reference import LAYOUTS, make_cache, read_entries, write_entries  # noqa: E402


def test_amax448_entries_round_trip_with_sglang_scales():
    lay = LAYOUTS["v32"]
    g = torch.Generator().manual_seed(7)
    vals = (torch.randn(40, lay.dqk, generator=g) * torch.rand(40, 1, generator=g) * 3).to(torch.bfloat16)
    buf, _ = make_cache(torch, lay, 2, 64, "cpu")
    idx = torch.arange(3, 43)
    write_entries(torch, lay, buf, 64, idx, vals, scale_mode="amax448")
    blk, off = idx // 64, idx % 64
    raw = torch.stack([buf[b, o * 656 + 512:o * 656 + 528] for b, o in zip(blk.tolist(), off.tolist(), strict=False)])
    scales = raw.contiguous().view(torch.float32)
    want = vals.float()[:, :512].view(40, 4, 128).abs().amax(-1) / 448
    assert torch.equal(scales, want)
    assert not torch.equal(torch.exp2(torch.log2(scales).round()), scales)   # not powers of two
    back = read_entries(torch, lay, buf, 64, idx)
    nope, ref = back[:, :512].view(40, 4, 128), vals.float()[:, :512].view(40, 4, 128)
    # e4m3 keeps 3 mantissa bits: |error| <= 2^-4 relative, plus its subnormal step (2^-9 x scale)
    assert ((nope - ref).abs() <= ref.abs() * 2 ** -4 + 2 ** -9 * scales[..., None] + 1e-12).all()
    assert torch.equal(back[:, 512:], vals.float()[:, 512:])   # RoPE stays bf16
