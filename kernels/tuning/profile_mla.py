#!/usr/bin/env python3
"""Tuning aid (not the benchmark): one launch per configuration for ncu, V4-Flash CSA at B=128 (no split)."""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parent / "bench"))

import torch  # noqa: E402
from harness import PAGE, distinct_indices, random_pool  # noqa: E402

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode  # noqa: E402
from pdserve_kernels.sparse_mla_reference import LAYOUTS  # noqa: E402

gen = torch.Generator(device="cuda")
gen.manual_seed(0)
lay = LAYOUTS["v4"]
_, kv = random_pool(lay, 1 << 20, gen)
_, win = random_pool(lay, 1 << 17, gen)
mla = SparseMlaDecode()
B = 128
ind = distinct_indices(B, 512, kv.shape[0] * PAGE, gen).view(B, 1, 512)
wind = distinct_indices(B, 128, win.shape[0] * PAGE, gen).view(B, 1, 128)
for h in (16, 64):
    q = torch.randn((B, 1, h, 512), device="cuda", generator=gen).to(torch.bfloat16)
    mla(q, kv, ind, 0.0625, layout="v4", extra_kv=win, extra_indices=wind, splits=1)
torch.cuda.synchronize()
