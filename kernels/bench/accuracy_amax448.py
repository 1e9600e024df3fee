"""Accuracy of the sparse MLA decode kernels on V3.2 FP8 caches with SGLang's own scales (fp32 amax/448 per
128-value tile, not powers of two; quantize_amax448 in sparse_mla_reference.py) against the fp32 reference
(which dequantizes the same bytes), beside the same kernels on power-of-two scales: the default (exact on any fp32
scale), the lossy opt-in's choice (lossy_bf16_dequant=True: e4m3 x scale rounded to bf16), the ds kernel and
(sm_90a) the wge kernel. One table: relative L2 error of o over all (row, head) pairs, the worst (row, head),
max |lse - ref|.

    python3 kernels/bench/accuracy_amax448.py [--heads 16,32,64,128] [--batches 1,8,64] [--json FILE]
"""

from __future__ import annotations

import argparse

import torch
from harness import finish, row_table, run_env, seeded_generator

from pdserve_kernels.sparse_mla_decode import SparseMlaDecode
from pdserve_kernels.sparse_mla_reference import make_inputs, reference_from_inputs

SCALE = 0.1352   # DeepSeek's softmax scale


def errors(mla, inp, **kw):
    o, lse = mla(inp["q"], inp["kv"], inp["indices"], SCALE, layout="v32", sinks=inp["sinks"], **kw)
    ref_o, ref_lse = reference_from_inputs(inp, SCALE)
    fin = ~torch.isinf(ref_lse)
    num = (o.float() - ref_o)[fin].norm(dim=-1)
    den = ref_o[fin].norm(dim=-1).clamp_min(1e-30)
    return {"rel": (num.norm() / den.norm()).item(), "worst": (num / den).max().item(),
            "lse": (lse[fin] - ref_lse[fin]).abs().max().item(), "nan": bool(torch.isnan(o.float()).any())}


def kernels(mla, B: int, h: int) -> list[tuple[str, str, bool]]:
    """(label, kernel, lossy opt-in): the default, the lossy opt-in's choice, the ds kernel and, on sm_90a, every wge
    kernel of the fatbin (the exact-scale wg kernels), each once (the first label wins)."""
    out = [("default", mla.make_plan("v32", B, h, 2048).kernel, False),
           ("lossy opt-in", mla.make_plan("v32", B, h, 2048, lossy_bf16_dequant=True).kernel, True),
           ("ds", mla.pick_kernel("v32", h, variant="ds", rows=B, entries=2048), False)]
    if mla.capability[0] == 9:
        out += [("wge", n, False) for n, k in sorted(mla.kernels.family("wg").items()) if k.shape.get("exact_scales")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="16,32,64,128")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--json")
    args = ap.parse_args()
    env, gen, mla = run_env(), seeded_generator(), SparseMlaDecode()
    rows = []
    for B in (int(x) for x in args.batches.split(",")):
        for h in (int(x) for x in args.heads.split(",")):
            for mode in ("amax448", "pow2"):
                inp = make_inputs("v32", B, 1, h, 2048, generator=gen, scale_mode=mode)
                seen = set()
                for variant, kernel, lossy in kernels(mla, B, h):
                    if kernel in seen:
                        continue
                    seen.add(kernel)
                    rows.append(dict(B=B, h=h, scales=mode, variant=variant, kernel=kernel,
                                     **errors(mla, inp, kernel=kernel, lossy_bf16_dequant=lossy)))

    table = row_table("",
                      "| B | h | scales | kernel | rel L2 error of o | worst (row, head) | max abs lse error | NaN |",
                      "| {B} | {h} | {scales} | {kernel} ({variant}) | {rel:.2e} | {worst:.2e} | {lse:.1e} | {nan} |")
    return finish(env, rows, args.json, table)


if __name__ == "__main__":
    raise SystemExit(main())
