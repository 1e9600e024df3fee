"""What makes a DSA-tier run pass, from what compare.py collected (pure; compare.py exits 1 on a failure).

* Each server says, in its plugin status line, the kernels its PDSERVE_DSA_KERNELS asked for: both ops on
  pdserve's when asked (with a "ran" line per op and no fallback), both on SGLang's when not.
* With records (eager, PDSERVE_DSA_RECORD_DIR): the top-k sets equal SGLang's (a row may differ only in
  entries tied at the k-th score: MIN_OVERLAP), sparse MLA within MAX_VS_SGLANG of FlashMLA and within
  MAX_VS_FP32 of the fp32 reference on the same cache bytes (measured 1.7e-3; FlashMLA 5.1-5.6e-3), no
  non-finite value.
* With records, both ops recorded and some indexer row longer than its top-k.
* Plugin off against on: no NaN or infinite logprob, and the largest chosen-token |dlogprob| on the shared prefix
  at most MAX_LOGPROB_DIFF. Token equality is not required: the tiny model amplifies bit-level differences, and
  SGLang's own repeats differ (README "Measured"). What this cannot see: anything after a request's first
  divergence, where the two contexts differ. The tiny models diverge early (V3.2 at token 0-31, V4 at 0-15 in the
  recorded runs), so a decode kernel that is wrong but finite can pass it; the top logprobs up to the divergence do
  not separate either (correct kernels differed there by up to 0.76 nats on V3.2 and 1.37 on V4, over 2x SGLang's
  own floor once). The per-layer records are the proof; a run without them shows that the kernels ran, finite.

DeepSeek-V4 (`--arch v4`, README "DeepSeek-V4"), judged per layer against the model's compress ratios:

* First the gate: SGLang's own server, plugin off, serves both request sets three times (the first a warm-up: JIT
  compiles and autotuning fall there), and passes 2 and 3 are compared as tensors (gate_failures). The first GPU run
  (2026-12-06, no warm-up then) found 0/4 identical, every request's first-token logprobs already different: that
  token comes from SGLang's prefill, which the plugin does not touch (it hooks decode only). So by default a gate
  that differs is recorded, not fatal: its differences are the noise floor the logprobs off against on are judged
  against (below), and the per-layer records, which compare both kernels on the same inputs inside one server, are
  the proof. `--strict-gate` makes a differing gate a failure (for when SGLang repeats itself). The all-in-one
  requests are not gated: SGLang may split their prefills differently from one pass to the next, which changes
  rounding but no kernel.
* The prefix cache was off as asked (prefix_cache_failures).
* Records (v4_record_failures): every layer's sparse MLA decode and every C4 layer's indexer recorded, and
  - top-k: a row may differ from SGLang's set in at most V4_MAX_TOPK_DIFF of its index_topk entries. Why any:
    pdserve's fused indexer and DeepGEMM's logits sum the 64 heads' weighted ReLU(q.k) over the same FP8
    inputs in a different order, so two keys whose fp32 scores are within a rounding of each other at the
    512th place can trade places; each trade is one entry. Why 2: one such near-tie per row at most, in
    either direction (the probe saw none: identical sets on all rows); a wrong page mapping or scale moves
    hundreds. Some recorded row must be longer than index_topk compressed entries, or the top-k never chose.
  - sparse MLA: rel L2 <= MAX_VS_SGLANG from FlashMLA on the same call, <= MAX_VS_FP32 from the fp32 reference
    over SGLang's own cache bytes, no non-finite value. Why these: V4's UE8M0 scales make e4m3 x scale exact
    in bf16, so both kernels differ from the exact result by their bf16 rounding (of the probabilities in
    P.V and of the output; rounding the output alone is ~1.7e-3 rel L2, and pdserve's V3.2 kernel measured
    1.70e-3 from the same reference); 3e-3 is ~1.8x that, and 1e-2 leaves room for FlashMLA's own share
    (probe: 4.8e-5 from pdserve's on window-only layers, 1.0-2.3e-3 through a two-launch merge).
    A wrong slot, page, scale or sink gives errors of order 1.
* Plugin off against on, per request set (logprob_floor_failures), pass 2 of each server (after its warm-up): the
  figure is the floor's own (noise_floor: the largest chosen-token |dlogprob| on a shared prefix and top logprob
  difference at the first generated token), and it must be at most max(MAX_LOGPROB_DIFF, FLOOR_FACTOR x SGLang's
  floor for that set). Why the larger of the two: a server that repeats itself (floor 0) still leaves the two
  kernels' rounding to differ, which the DSA tier bounds by 0.5. Why 2 x the floor: the floor is the largest of a
  few requests' differences (4 here), itself a draw of the noise; a second draw of the same noise (off against on,
  with no kernel difference at all) beats the first draw's maximum about half the time, so the floor alone would
  fail a correct kernel as often as not. The DSA tier measured six such maxima (over 6 requests each) between runs
  whose per-layer records showed the kernels within rounding (SGLang against itself 0.314 and 0.34, pdserve's
  against itself 0.252 and 0.399, off against on 0.323 and 0.437): the largest is 1.73x the smallest, and 2 covers
  that. Why it still catches something: a wrong slot, page or scale moves logprobs by whole nats; where FLOOR_FACTOR
  x floor reaches WRONG_KERNEL_NATS (1 nat) the comparison can no longer tell, and the verdict says so in a note
  (the records then judge alone).
"""

from __future__ import annotations

from tests.gpu.dsa import diff  # pure as well; diff.py imports this module only inside its main()

MIN_OVERLAP = 0.999  # 2 of 2048 entries
MAX_VS_SGLANG = 1e-2
MAX_VS_FP32 = 3e-3
MAX_LOGPROB_DIFF = 0.5
FLOOR_FACTOR = 2.0
WRONG_KERNEL_NATS = 1.0
OPS = ("indexer_topk", "sparse_mla_decode")
V4_INDEX_TOPK = 512
V32_INDEX_TOPK = 2048
V4_MAX_TOPK_DIFF = 2  # entries per row


def plugin_failures(kernels: str, plugin: dict[str, list], model: str | None = None) -> list[str]:
    """`model`: the backend every status line must come from ("deepseek_v4" for V4; V3.2's lines name none)."""
    statuses = plugin.get("status", [])
    if not statuses:
        return [f"[{kernels}] no plugin status line in the server log (is the pdserve-kernels wheel installed?)"]
    out = []
    for s in statuses:
        got = s.get("kernels", {})
        if any(got.get(op) != kernels for op in OPS):
            out.append(f"[{kernels}] status says {got} (reasons {s.get('reasons')}), expected {kernels} for both")
        if model is not None and s.get("model") != model:
            out.append(f"[{kernels}] a status line from a {s.get('model')!r} backend, expected {model!r}")
    if kernels == "pdserve":
        ran = {r.get("op") for r in plugin.get("ran", [])}
        out += [f"[pdserve] {op} never ran pdserve's kernel" for op in OPS if op not in ran]
        out += [f"[pdserve] fallback: {f}" for f in plugin.get("fallback", [])]
    return out


def record_failures(rows: list[dict], index_topk: int = V32_INDEX_TOPK) -> list[str]:
    """V3.2's records (diff.summarize_records rows): both ops recorded, some indexer row longer than `index_topk`
    (else the top-k never chose), and every record within its bounds. (Which layers: V3.2's bf16 MLA hook has no
    layer id to record, so coverage per layer is V4's check only.)"""
    if not rows:
        return ["no records were written (PDSERVE_DSA_RECORD_DIR set, but no eager decode call recorded)"]
    out = [f"{op}: no record" for op in OPS if op not in {r["op"] for r in rows}]
    topk_rows = [r for r in rows if r["op"] == "indexer_topk"]
    if topk_rows and max(r.get("longest", 0) for r in topk_rows) <= index_topk:
        out.append(f"indexer_topk: no recorded row is longer than {index_topk}: the top-k never chose")
    for r in rows:
        where = f"{r['op']} layer {r['layer']}"
        if r["op"] == "indexer_topk":
            if not r["overlap_min"] >= MIN_OVERLAP:  # NaN fails too
                out.append(f"{where}: a top-k row shares only {r['overlap_min']:.4f} of SGLang's set")
            out += _topk_shape_failures(where, r)
            continue
        out += _mla_failures(where, r)
    return out


def _topk_shape_failures(where: str, r: dict) -> list[str]:
    """A slot picked twice, or another number of picks than SGLang's: wrong however large the overlap (records from
    before 2026-12-07 lack these counts and are not judged on them)."""
    out = []
    if r.get("rows_with_repeats"):
        out.append(f"{where}: {r['rows_with_repeats']} rows hold a slot twice")
    if r.get("rows_selecting_another_count"):
        out.append(f"{where}: {r['rows_selecting_another_count']} rows select another number of slots than SGLang")
    return out


def diff_failures(result: dict) -> list[str]:
    """V3.2, plugin off against on: no non-finite logprob, and the chosen-token |dlogprob| on the shared prefix
    within MAX_LOGPROB_DIFF. This sees nothing past a request's first divergence (the contexts differ there), and
    the tiny model diverges early, so it cannot convict a wrong decode kernel alone: the records can."""
    out = nonfinite_failures(result)
    worst = result.get("max_abs_logprob_diff")
    if worst is not None and not worst <= MAX_LOGPROB_DIFF:
        out.append(f"plugin off against on: largest |dlogprob| {worst:.4f} > {MAX_LOGPROB_DIFF}")
    return out


def nonfinite_failures(result: dict) -> list[str]:
    """Any NaN or infinite logprob (chosen or top, either server) in an off-against-on comparison."""
    bad = [r for r in result["rows"] if r.get("nonfinite_logprobs")]
    if not bad:
        return []
    first = bad[0]
    return [f"plugin off against on: {sum(r['nonfinite_logprobs'] for r in bad)} logprobs are NaN or infinite "
            f"({len(bad)} requests; first: {first['set']} request {first['request']})"]


def gate_failures(gate: dict) -> list[str]:
    """SGLang against itself: the one-at-a-time requests must repeat as identical tensors (--strict-gate)."""
    st = gate["sets"].get("sequential")
    if st is None or not st["requests"]:
        return ["repeatability gate: no one-at-a-time requests were served twice"]
    if st["identical"] == st["requests"]:
        return []
    first = next(r for r in st["rows"] if not r["identical"])
    return [f"repeatability gate: SGLang's own server (plugin off) served the same requests twice and "
            f"{st['requests'] - st['identical']}/{st['requests']} differed ({diff.difference_text(first)}; "
            f"{floor_text(st)})"]


def floor_text(st: dict) -> str:
    """A gate set's figures (diff.set_figures) in words: what SGLang's own run-to-run noise reached."""
    d, chosen, first = st.get("first_divergence"), st["max_abs_logprob_diff"], st["max_first_token_top_logprob_diff"]
    return (f"over the set: tokens {'equal' if d is None else f'first diverge at token {d}'}, largest |dlogprob| on a "
            f"shared prefix {'- (none shared)' if chosen is None else f'{chosen:.3g}'}, top logprobs at token 0 "
            f"up to {'-' if first is None else f'{first:.3g}'}")


def noise_floor(st: dict) -> float:
    """One request set's noise floor from the gate (a repeat_check set): the largest logprob difference SGLang's own
    server showed between the two compared passes where the two are comparable: chosen tokens on a shared prefix,
    and the top logprobs at the first generated token (comparable even when the tokens differ from the start)."""
    figures = (st.get("max_abs_logprob_diff"), st.get("max_first_token_top_logprob_diff"))
    return max((f for f in figures if f is not None), default=0.0)


def noise_floors(gate: dict) -> dict[str, float]:
    return {name: noise_floor(st) for name, st in gate["sets"].items()}


def logprob_limit(floor: float) -> float:
    return max(MAX_LOGPROB_DIFF, FLOOR_FACTOR * floor)


def logprob_floor_failures(result: dict, gate: dict | None) -> tuple[list[str], list[str]]:
    """Plugin off against on (diff.compare_runs), per request set, measured as the floor is (noise_floor of the
    same figures), against logprob_limit of that set's floor (0 where no gate measured one). Returns failures
    and notes (a limit too wide to tell a wrong kernel from noise)."""
    failures, notes = [], []
    by_set: dict[str, list[dict]] = {}
    for row in result["rows"]:
        by_set.setdefault(row["set"], []).append(row)
    for name, rows in by_set.items():
        seen = noise_floor(diff.set_figures(rows))
        floor = noise_floor(gate["sets"][name]) if gate is not None and name in gate["sets"] else 0.0
        limit = logprob_limit(floor)
        if not seen <= limit:  # NaN fails too
            failures.append(f"plugin off against on, {name} requests: largest logprob difference {seen:.4f} > "
                            f"{limit:.4f} (the larger of {MAX_LOGPROB_DIFF} and {FLOOR_FACTOR:g} x SGLang's own "
                            f"noise floor {floor:.4f})")
        if limit >= WRONG_KERNEL_NATS:
            notes.append(f"{name} requests: SGLang's own noise floor {floor:.4f} makes the logprob limit {limit:.4f} "
                         f"nats, as wide as a wrong kernel's error: only the per-layer records judge the kernels")
    return failures, notes


def v4_verdict(runs: dict[str, dict], gate: dict | None, records: list[dict] | None, result: dict | None,
               config: dict, *, strict_gate: bool = False, both: bool = False) -> tuple[list[str], list[str]]:
    """The whole V4 verdict from what one call (or two calls, diff.py OUT1 OUT2) collected: `runs` the compare
    records by kernels (either, or both; `both`: a missing one fails), `gate` SGLang's (diff.gate_from_passes),
    `records` the pdserve server's per-layer summary, `result` off against on (diff.compare_runs), `config` the
    model's. Returns failures and notes; notes say what the run could not show (SGLang did not repeat itself)
    without failing it."""
    failures: list[str] = []
    notes: list[str] = []
    if both:
        failures += [f"no {kernels} server's compare record: the {what} run is missing (did its call time out?)"
                     for kernels, what in (("sglang", "plugin-off"), ("pdserve", "plugin-on")) if kernels not in runs]
    for kernels, run in runs.items():
        failures += plugin_failures(kernels, run["plugin"], model="deepseek_v4")
        failures += prefix_cache_failures(run.get("tree_cache_impl"), "--disable-radix-cache" not in run["argv"])
    if "pdserve" in runs:
        failures += v4_record_failures(records or [], config)
    if gate is not None:
        differed = gate_failures(gate)
        if strict_gate:
            failures += differed
        elif differed:
            what = differed[0].removeprefix("repeatability gate: ")
            notes += [f"SGLang did not repeat itself (not required without --strict-gate): {what}. Tokens and "
                      "logprobs off against on are therefore bounded only by that floor (logprob limit per set: the "
                      f"larger of {MAX_LOGPROB_DIFF} and {FLOOR_FACTOR:g} x the floor); the proof is the per-layer "
                      "records, pdserve's kernel against SGLang's on the same inputs inside one server"]
    if result is not None:
        more, why = logprob_floor_failures(result, gate)
        failures += nonfinite_failures(result) + more
        notes += why
    elif set(runs) != {"sglang", "pdserve"}:
        notes.append(f"only {', '.join(runs) or 'no'} server in these files: no comparison off against on "
                     "(diff.py OUT1 OUT2 combines a plugin-off call's files with a plugin-on call's)")
    return failures, notes


def prefix_cache_failures(impl: str | None, radix_cache: bool) -> list[str]:
    """With the radix cache off SGLang builds a chunk cache (SWAChunkCache for V4's window layers)."""
    if not radix_cache and impl is not None and "Radix" in impl:
        return [f"--disable-radix-cache was passed but SGLang built {impl}"]
    return []


def v4_record_failures(rows: list[dict], config: dict) -> list[str]:
    """The plugin's records of a V4 run against the layers `config` has (compress_ratios, index_topk)."""
    if not rows:
        return ["no records were written (PDSERVE_DSA_RECORD_DIR set, but no eager decode call recorded)"]
    ratios = config["compress_ratios"]
    topk = int(config.get("index_topk", V4_INDEX_TOPK))
    min_overlap = 1 - V4_MAX_TOPK_DIFF / topk
    found = {(r["op"], r["layer"]) for r in rows}
    out = [f"sparse_mla_decode layer {i} (compress ratio {ratio}): no record" for i, ratio in enumerate(ratios)
           if ("sparse_mla_decode", i) not in found]
    out += [f"indexer_topk layer {i} (C4): no record" for i, ratio in enumerate(ratios)
            if ratio == 4 and ("indexer_topk", i) not in found]
    topk_rows = [r for r in rows if r["op"] == "indexer_topk"]
    if topk_rows and max(r.get("longest", 0) for r in topk_rows) <= topk:
        out.append(f"indexer_topk: no recorded row is longer than {topk} compressed entries: the top-k never chose")
    for r in rows:
        where = f"{r['op']} layer {r['layer']}"
        if r["layer"] >= len(ratios) or r["layer"] < 0:
            out.append(f"{where}: the model has layers 0-{len(ratios) - 1}")
            continue
        if r["op"] == "indexer_topk":
            if ratios[r["layer"]] != 4:
                out.append(f"{where}: an indexer record on a layer of compress ratio {ratios[r['layer']]}")
                continue
            if not r["overlap_min"] >= min_overlap:  # NaN fails too
                missed = (1 - r["overlap_min"]) * topk
                out.append(f"{where}: a top-k row shares only {r['overlap_min']:.4f} of SGLang's set "
                           f"(up to {missed:.0f} of {topk} entries differ; at most {V4_MAX_TOPK_DIFF} may)")
            out += _topk_shape_failures(where, r)
            continue
        out += _mla_failures(where, r)
    return out


def _mla_failures(where: str, r: dict) -> list[str]:
    """A NaN figure (SGLang's output or the reference non-finite, which pdserve's count does not see) fails."""
    out = []
    if r["nonfinite"]:
        out.append(f"{where}: {r['nonfinite']} non-finite outputs")
    if not r["rel_l2_max"] <= MAX_VS_SGLANG:
        out.append(f"{where}: rel L2 {r['rel_l2_max']:.3g} from SGLang's kernel > {MAX_VS_SGLANG}")
    if "ours_vs_fp32_max" not in r:
        out.append(f"{where}: no fp32 reference rows recorded")
    elif not r["ours_vs_fp32_max"] <= MAX_VS_FP32:
        out.append(f"{where}: rel L2 {r['ours_vs_fp32_max']:.3g} from the fp32 reference > {MAX_VS_FP32}")
    return out
