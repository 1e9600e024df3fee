#!/usr/bin/env python3
"""Profiling aid: a few calls on fixed shapes, for ncu (per-kernel durations) or sanity timing."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import torch
from harness import fixed_generator, indexer_pool, indexer_requests, random_pages

from pdserve_kernels.dsa_indexer import DsaIndexer

gen = fixed_generator(3)
ind = DsaIndexer()
shapes = [(int(b), int(n)) for b, n in (x.split("x") for x in sys.argv[1].split(","))]
kv = indexer_pool(max(b * n for b, n in shapes) // 64, gen)
for B, L in shapes:
    q, w, ctx, used = indexer_requests(B, L, gen, random_pages(kv.shape[0], B, L, gen))
    for _ in range(2):
        out, sc = ind(q, w, kv, ctx, used, 2048, max_len=L, return_scores=True)
    torch.cuda.synchronize()
    # Candidate counts the select pass sees: positions in the threshold bin (top 12 bits), and in the
    # second-level bin (next 10 bits).
    u = sc[:, :L].contiguous().view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(u >= 0x80000000, 0xFFFFFFFF - u, u | 0x80000000)
    kth = torch.topk(key, 2048, dim=1).values[:, -1:]
    t1 = (key >> 20) == (kth >> 20)
    t2 = t1 & (((key >> 10) & 1023) == ((kth >> 10) & 1023))
    print("done", B, L, f"ties per row: bin1 mean {t1.sum(1).float().mean():.0f} max {int(t1.sum(1).max())}, "
          f"bin2 mean {t2.sum(1).float().mean():.0f}", flush=True)
