"""What makes a DSA-tier run pass, from what compare.py collected (pure; compare.py exits 1 on a failure).

* Each server says, in its plugin status line, the kernels its PDSERVE_DSA_KERNELS asked for: both ops on
  pdserve's when asked (with a "ran" line per op and no fallback), both on SGLang's when not.
* With records (eager, PDSERVE_DSA_RECORD_DIR): the top-k sets equal SGLang's (a row may differ only in
  entries tied at the k-th score: MIN_OVERLAP), sparse MLA within MAX_VS_SGLANG of FlashMLA and within
  MAX_VS_FP32 of the fp32 reference on the same cache bytes (measured 1.7e-3; FlashMLA 5.1-5.6e-3), no
  non-finite value.
* Plugin off against on: the largest chosen-token |dlogprob| on the shared prefix at most MAX_LOGPROB_DIFF.
  Token equality is not required: the tiny model amplifies bit-level differences, and SGLang's own repeats
  differ (README "Measured").
"""

from __future__ import annotations

MIN_OVERLAP = 0.999  # 2 of 2048 entries
MAX_VS_SGLANG = 1e-2
MAX_VS_FP32 = 3e-3
MAX_LOGPROB_DIFF = 0.5
OPS = ("indexer_topk", "sparse_mla_decode")


def plugin_failures(kernels: str, plugin: dict[str, list]) -> list[str]:
    statuses = plugin.get("status", [])
    if not statuses:
        return [f"[{kernels}] no plugin status line in the server log (is the pdserve-kernels wheel installed?)"]
    out = []
    for s in statuses:
        got = s.get("kernels", {})
        if any(got.get(op) != kernels for op in OPS):
            out.append(f"[{kernels}] status says {got} (reasons {s.get('reasons')}), expected {kernels} for both")
    if kernels == "pdserve":
        ran = {r.get("op") for r in plugin.get("ran", [])}
        out += [f"[pdserve] {op} never ran pdserve's kernel" for op in OPS if op not in ran]
        out += [f"[pdserve] fallback: {f}" for f in plugin.get("fallback", [])]
    return out


def record_failures(rows: list[dict]) -> list[str]:
    if not rows:
        return ["no records were written (PDSERVE_DSA_RECORD_DIR set, but no eager decode call recorded)"]
    out = []
    for r in rows:
        where = f"{r['op']} layer {r['layer']}"
        if r["op"] == "indexer_topk":
            if r["overlap_min"] < MIN_OVERLAP:
                out.append(f"{where}: a top-k row shares only {r['overlap_min']:.4f} of SGLang's set")
            continue
        if r["nonfinite"]:
            out.append(f"{where}: {r['nonfinite']} non-finite outputs")
        if r["rel_l2_max"] > MAX_VS_SGLANG:
            out.append(f"{where}: rel L2 {r['rel_l2_max']:.3g} from SGLang's kernel > {MAX_VS_SGLANG}")
        if "ours_vs_fp32_max" not in r:
            out.append(f"{where}: no fp32 reference rows recorded")
        elif r["ours_vs_fp32_max"] > MAX_VS_FP32:
            out.append(f"{where}: rel L2 {r['ours_vs_fp32_max']:.3g} from the fp32 reference > {MAX_VS_FP32}")
    return out


def diff_failures(result: dict) -> list[str]:
    worst = result.get("max_abs_logprob_diff")
    if worst is not None and worst > MAX_LOGPROB_DIFF:
        return [f"plugin off against on: largest |dlogprob| {worst:.4f} > {MAX_LOGPROB_DIFF}"]
    return []
