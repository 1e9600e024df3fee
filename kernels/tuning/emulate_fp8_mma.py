#!/usr/bin/env python3
"""Tuning aid (CPU, numpy, fp64): would sparse MLA decode keep its accuracy with e4m3 tensor-core MMAs, so that the
16-head kernels need not convert the e4m3 cache to f16 at all? QK: q's NoPE part (bf16) scaled per head by a power of
two and split into a sum of `--q-terms` e4m3 values, times the raw e4m3 K payload, each 64-dim group's fp32 partial
times its UE8M0 scale (as the kernels apply it); PV: P times the entry's scale relative to the tile's largest (per
64-dim group) split into `--p-terms` e4m3 values, times the raw e4m3 V payload; RoPE dims in bf16 as now. Prints the
output's relative L2 error against the fp64 reference after rounding to bf16 (as the kernels write it), next to the
error of the exact computation rounded the same way. V4-Flash CSA shapes (640 entries, 448 e4m3 + 64 bf16 dims).

    python3 kernels/tuning/emulate_fp8_mma.py [--trials 10]
"""
from __future__ import annotations

import argparse

import numpy as np


def e4m3(x: np.ndarray) -> np.ndarray:
    """Round to the nearest e4m3 value (ties to even; subnormals from 2^-9; saturating at 448)."""
    a = np.abs(x)
    e = np.clip(np.floor(np.log2(np.maximum(a, 1e-300))), -6, 8)
    return np.sign(x) * np.minimum(np.round(a / 2.0 ** (e - 3)) * 2.0 ** (e - 3), 448.0)


def bf16(x: np.ndarray) -> np.ndarray:
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def e4m3_terms(x: np.ndarray, terms: int) -> np.ndarray:
    """x as the sum of `terms` e4m3 values, each rounding what the earlier ones left."""
    total, rest = np.zeros_like(x), x.copy()
    for _ in range(terms):
        part = e4m3(rest)
        total, rest = total + part, rest - part
    return total


def pow2_row_scale(x: np.ndarray, top: float = 448.0) -> np.ndarray:
    """Per row the power of two that brings the row's max |x| into [top / 2, top)."""
    m = np.abs(x).max(axis=-1, keepdims=True)
    return 2.0 ** np.floor(np.log2(top / np.maximum(m, 1e-300)))


def one_case(rng, q_terms: int, p_terms: int, q_mult: float, h: int = 16, n: int = 640, nope: int = 448,
             rope: int = 64) -> dict[str, float]:
    q = bf16(rng.standard_normal((h, nope + rope)) * q_mult)
    payload = e4m3(rng.standard_normal((n, nope)) * 100)
    scale = 2.0 ** rng.integers(-12, -4, size=(n, nope // 64))
    k_nope = payload * np.repeat(scale, 64, axis=1)
    k_rope = bf16(rng.standard_normal((n, rope)))
    k = np.concatenate([k_nope, k_rope], axis=1)
    sm = (nope + rope) ** -0.5

    def attend(s, pv):
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return pv(p) / p.sum(axis=1, keepdims=True)

    def pv_fp8(p):
        out = np.zeros((h, 512))
        for grp in range(nope // 64):
            ref = scale[:, grp].max()
            pp = p * (scale[:, grp] / ref)[None, :]
            f = pow2_row_scale(pp)
            cols = slice(64 * grp, 64 * grp + 64)
            out[:, cols] = (e4m3_terms(pp * f, p_terms) / f) @ payload[:, cols] * ref
        pmax = p.max(axis=1, keepdims=True)
        out[:, nope:] = bf16(p / pmax) @ k_rope * pmax
        return out

    ref = attend(q @ k.T * sm, lambda p: p @ k[:, :512])
    f = pow2_row_scale(q[:, :nope])
    s8 = ((e4m3_terms(q[:, :nope] * f, q_terms) / f) @ k_nope.T + q[:, nope:] @ k_rope.T) * sm
    outs = {"exact": ref, "fp8 QK": attend(s8, lambda p: p @ k[:, :512]), "fp8 QK + PV": attend(s8, pv_fp8)}
    return {key: np.linalg.norm(bf16(o) - ref) / np.linalg.norm(ref) for key, o in outs.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| q x | Q terms | P terms | exact, bf16 out: mean / max | fp8 QK | fp8 QK + PV |")
    print("|---|---|---|---|---|---|")
    for q_mult in (1.0, 4.0, 16.0):   # larger q: a sharper softmax
        for q_terms, p_terms in ((1, 1), (2, 1), (2, 2), (3, 3)):
            runs = [one_case(rng, q_terms, p_terms, q_mult) for _ in range(args.trials)]
            cells = [f"{np.mean([r[k] for r in runs]):.2e} / {np.max([r[k] for r in runs]):.2e}" for k in runs[0]]
            print(f"| {q_mult:g} | {q_terms} | {p_terms} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
