"""The measuring half of bench_targets.py (GPU): one row at a time, ours and the comparator timed round-robin
on the same inputs, then ours checked. What the rows are and how they are judged is in targets.py."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch
from deepgemm_adapter import DEEPGEMM_DIST, DeepGemmTopk
from deepgemm_adapter import load as load_deep_gemm
from flashmla_adapter import FLASHMLA_COMMIT, FlashMlaDecode
from flashmla_adapter import load as load_flashmla
from harness import (
    CASES,
    MlaLaunchers,
    Timer,
    copy_bandwidth,
    floor_us,
    indexer_key_bytes,
    indexer_pool,
    matmul_tflops,
    mla_batch,
    run_env,
    seeded_generator,
    sh,
)
from targets import INDEXER_TOPK, MLA_CASES, render_markdown

# From the modules: the package's names sparse_mla_decode / dsa_indexer are its convenience functions.
from pdserve_kernels.dsa_indexer import DsaIndexer
from pdserve_kernels.dsa_indexer import find_fatbin as indexer_fatbin
from pdserve_kernels.reference import PAGE, reference_scores

MLA_REL_TOL, MLA_LSE_TOL = 5e-3, 1e-3   # tests/kernels/test_sparse_mla_decode_gpu.py's bounds
INDEXER_SCORE_TOL = 1e-3                # relative L2 of our fp32 scores (DeepGEMM's own is ~1e-4)


def rel_l2(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def sha8(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()[:8]


def is_exact_topk(idx, scores) -> bool:
    """Whether each row of idx [rows, k] is a top-k of that row of scores [rows, L]: k distinct positions in
    range, none scoring below the row's k-th largest score (ties at the k-th may go either way)."""
    L, k = scores.shape[1], idx.shape[1]
    if not bool(((idx >= 0) & (idx < L)).all()):
        return False
    srt = idx.sort(dim=1).values
    kth = torch.topk(scores, k, dim=1).values[:, -1]
    return bool((srt[:, 1:] != srt[:, :-1]).all()) and bool((scores.gather(1, idx).min(dim=1).values >= kth).all())


def set_share(idx, other, L: int) -> float:
    """The fraction of `other`'s selected positions (all rows) that `idx` selected too (both [rows, k], in range)."""
    mine = torch.zeros((idx.shape[0], L), dtype=torch.bool, device=idx.device)
    mine.scatter_(1, idx, True)
    return mine.gather(1, other).float().mean().item()


class Bench:
    """One run: launchers, comparators, ceilings and input pools, shared by every row."""

    def __init__(self, reps: int, rows: list[dict], lossy_bf16_dequant: bool = False):
        assert set(CASES) == set(MLA_CASES), "targets.MLA_CASES must name harness.CASES"
        self.reps, self.rows = reps, rows
        # sparse MLA's choice: the exact default, or the lossy opt-in (every call and plan of the run alike)
        self.choice = {"lossy_bf16_dequant": True} if lossy_bf16_dequant else {}
        self.gen = seeded_generator()
        self.timer = Timer()   # ~1 ms head start before every timed call (harness.Timer says why)
        self.mla = MlaLaunchers()   # V4's bf16 rows: the tuning fatbin (the production build has no bf16 V4 kernel)
        self.indexer = DsaIndexer()
        self.fm, fm_why = load_flashmla()
        self.dg, dg_why = load_deep_gemm()
        fatbins = (self.mla.production.path, indexer_fatbin(),
                   *([self.mla.tuning_path] if self.mla.tuning_path.is_file() else []))
        self.env = run_env(
            reps=reps, commit=os.environ.get("PDSERVE_COMMIT") or sh("git rev-parse --short HEAD") or "?",
            sparse_mla_choice="lossy opt-in (lossy_bf16_dequant=True)" if lossy_bf16_dequant else "exact default",
            fatbins=", ".join(f"{pathlib.Path(f).name} {sha8(f)}" for f in fatbins),
            flash_mla=(f"{FLASHMLA_COMMIT[:8]} (importable)" if self.fm else f"not importable: {fm_why}")[:200],
            deep_gemm=(f"{DEEPGEMM_DIST} (importable)" if self.dg else f"not importable: {dg_why}")[:200])
        t0 = time.monotonic()
        self.env["copy_GBps"] = round(copy_bandwidth(self.timer), 1)
        self.env["matmul_TFLOPs"] = round(matmul_tflops(self.timer), 1)
        print(json.dumps(self.env), flush=True)
        print(f"[time] ceilings {time.monotonic() - t0:.1f} s", flush=True)
        self.mla_pools = {}
        self.indexer_inputs = None

    def run(self, json_path: str | None) -> int:
        done = []
        t_start = time.monotonic()
        for spec in self.rows:
            t0 = time.monotonic()
            row = dict(spec)
            try:
                row.update(self.mla_row(spec) if spec["kernel"] == "sparse_mla" else self.indexer_row(spec))
            except Exception as e:  # noqa: BLE001 - recorded in the row (and the table), the run goes on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            row["wall_s"] = round(time.monotonic() - t0, 2)
            done.append(row)
            print(json.dumps(row), flush=True)
            if json_path:
                pathlib.Path(json_path).write_text(json.dumps({"env": self.env, "rows": done}, indent=1))
        print(f"[time] {len(done)} rows {time.monotonic() - t_start:.1f} s", flush=True)
        print(render_markdown(self.env, done))
        return 0

    def time_pair(self, ours, comparator) -> dict:
        """Median us of ours and, if there is one, the comparator, timed round-robin on the same inputs."""
        fns = [ours] + ([comparator] if comparator is not None else [])
        ts = self.timer.medians_us(fns, self.reps)
        return {"us": ts[0], **({"comparator_us": ts[1]} if comparator is not None else {})}

    # ---- sparse MLA decode ----

    def mla_row(self, spec: dict) -> dict:
        x = next(mla_batch(spec["case"], spec["B"], [spec["h"]], self.gen, self.mla_pools))
        mla = self.mla.for_layout(x.layout)
        plan = mla.make_plan(x.layout, x.B, x.h, x.ind.shape[-1],   # what the default call runs
                                  x.win_ind.shape[-1] if x.win_ind is not None else 0, **self.choice)
        bytes_, flops = x.bytes_flops()
        tuning = " (tuning fatbin)" if mla is not self.mla.production else ""
        row = {"default": f"{plan.kernel.replace('sparse_mla_', '')} ({plan.splits}){tuning}", "bytes": bytes_,
               "flops": flops,
               "floor_us": floor_us(bytes_, flops, self.env["copy_GBps"], self.env["matmul_TFLOPs"])}
        fm_call = None
        if self.fm is not None and not x.lay.bf16:   # FlashMLA's sparse decode is fp8-only
            row["comparator"] = "FlashMLA"
            try:   # its first call (which builds its tile schedule) runs here, outside the timing
                fm_call = FlashMlaDecode(self.fm, x.q, x.kv, x.ind, x.sm_scale, x.sinks, **x.extra)
                if fm_call.heads != x.h:
                    row["comparator"] = f"FlashMLA (h {fm_call.heads})"
            except Exception as e:  # noqa: BLE001 - the comparator's refusal is recorded, ours still timed
                row["comparator_error"] = f"{type(e).__name__}: {e}"[:300]
        row.update(self.time_pair(x.call(mla, **self.choice), fm_call))
        row.update(self.mla_check(mla, x, fm_call))
        return row

    def mla_check(self, mla, x, fm_call) -> dict:
        """Ours (`mla`) on every row against the fp32 reference over the same cache bytes (and FlashMLA's error
        beside)."""
        out, lse = x.call(mla, **self.choice)()
        ref_o, ref_lse = x.reference()
        rel = x.rel_err(out, ref_o)
        dl = (lse.view(x.B, x.h).float() - ref_lse).abs().max().item()
        finite = bool(torch.isfinite(out).all().item())
        check = {"rel_err": rel, "lse_err": dl, "ok": finite and rel <= MLA_REL_TOL and dl <= MLA_LSE_TOL,
                 "check": (f"ref L2 {rel:.1e}, lse {dl:.0e} (<= {MLA_REL_TOL:g}, {MLA_LSE_TOL:g})"
                           + ("" if finite else ", non-finite output"))}
        if fm_call is not None:
            check["comparator_rel_err"] = x.rel_err(fm_call.first, ref_o)
            check["ours_vs_comparator"] = rel_l2(out.reshape(x.B, x.h, 512), fm_call.first.reshape(x.B, x.h, 512))
        return check

    # ---- DSA indexer ----

    def indexer_pool(self):
        """The key pool, q and weights, made once for the largest B x L of the plan."""
        if self.indexer_inputs is None:
            specs = [r for r in self.rows if r["kernel"] == "dsa_indexer"]
            blocks = max(r["B"] * r["L"] for r in specs) // PAGE
            max_b = max(r["B"] for r in specs)
            q = torch.randn((max_b, 1, 64, 128), device="cuda", generator=self.gen).to(torch.float8_e4m3fn)
            w = torch.randn((max_b, 64), device="cuda", generator=self.gen) / 8
            self.indexer_inputs = indexer_pool(blocks, self.gen), q, w
        return self.indexer_inputs

    def indexer_row(self, spec: dict) -> dict:
        B, L = spec["B"], spec["L"]
        kv, q_all, w_all = self.indexer_pool()
        q, w = q_all[:B].contiguous(), w_all[:B].contiguous()
        pages = L // PAGE   # each request's pages at random, distinct positions of the whole pool
        bt = torch.randperm(kv.shape[0], device="cuda", generator=self.gen)[:B * pages].int().view(B, pages)
        ctx = torch.full((B,), L, dtype=torch.int32, device="cuda")
        key_bytes = indexer_key_bytes(B, L)
        row = {"bytes": key_bytes, "floor_us": floor_us(key_bytes, 0, self.env["copy_GBps"])}
        dg_call = None
        if self.dg is not None:
            row["comparator"] = "DeepGEMM+topk"
            try:   # the first call JIT-compiles DeepGEMM's kernels: outside the timing
                t0 = time.monotonic()
                dg_call = DeepGemmTopk(self.dg, q, w, kv, ctx, bt, INDEXER_TOPK, self.env["sms"])
                row["comparator_first_call_s"] = round(time.monotonic() - t0, 2)
            except Exception as e:  # noqa: BLE001 - the comparator's refusal is recorded, ours still timed
                row["comparator_error"] = f"{type(e).__name__}: {e}"[:300]
        row.update(self.time_pair(lambda: self.indexer(q, w, kv, ctx, bt, INDEXER_TOPK, max_len=L), dg_call))
        path, plan = getattr(self.indexer, "last_path", None), getattr(self.indexer, "last_plan", None)
        select = ", cluster select" if plan is not None and plan.cluster else ""
        row["default"] = f"{path[0]} (chunk {path[1]}{select})" if path else ""
        row.update(self.indexer_check(q, w, kv, ctx, bt, L, dg_call))
        return row

    def indexer_check(self, q, w, kv, ctx, bt, L: int, dg_call) -> dict:
        """Exact top-k of our own scores on every row; our scores against the fp32 reference (row 0) and
        DeepGEMM's logits (every row); the share of DeepGEMM's set that ours holds (not judged: near-ties)."""
        out, scores = self.indexer(q, w, kv, ctx, bt, INDEXER_TOPK, max_len=L, return_scores=True)
        sc = scores[:, :L]
        idx = out.long()
        exact = is_exact_topk(idx, sc)
        ref_err = rel_l2(sc[0], reference_scores(q[:1], w[:1], kv, ctx[:1], bt[:1], dtype=torch.float32)[0])
        check = {"exact": exact, "ref_err": ref_err}
        ok = exact and ref_err <= INDEXER_SCORE_TOL
        text = f"exact {'yes' if exact else 'NO'}, ref L2 {ref_err:.0e}"
        if dg_call is not None:
            dg_err = rel_l2(sc, dg_call.logits()[:, :L])
            share = set_share(idx, dg_call()[1], L) if exact else 0.0
            check.update(comparator_err=dg_err, comparator_set_share=share)
            ok = ok and dg_err <= INDEXER_SCORE_TOL
            text += f", DG L2 {dg_err:.0e}, {100 * share:.2f}% of DG's set"
        check.update(ok=ok, check=text + f" (<= {INDEXER_SCORE_TOL:g})")
        return check
