"""Compare two runs of compare.py (SGLang's kernels against pdserve's) and print the tables.

    python3 tests/gpu/dsa/diff.py OUT_DIR                 # compare-sglang.json vs compare-pdserve.json (+ bench)
    python3 tests/gpu/dsa/diff.py A.json B.json [--max-logprob-diff 0.05] [--require-equal-tokens]
    python3 tests/gpu/dsa/diff.py OUT_DIR --records OUT_DIR/record/pdserve   # + the plugin's shadow records
    python3 tests/gpu/dsa/diff.py OUT1 OUT2 [--strict-gate]   # V4 over two calls: OUT1 plugin off, OUT2 on

Given result directories of a V4 run (`compare.py --arch v4`, one call or two), it also prints the gate, the
records and verdict.py's whole V4 verdict, as compare.py does at the end of a call, and exits 1 on a failure.

Per request: are the greedy tokens equal, and if not where they first diverge; on the shared prefix
(every position up to and including the first divergence, where both runs had the same context) the
largest difference of the chosen token's logprob and of the top logprobs of tokens both runs list.
Pure Python, so it runs anywhere the JSON is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_request(a: dict, b: dict) -> dict:
    ids_a, ids_b = a["output_ids"], b["output_ids"]
    d = first_divergence(ids_a, ids_b)
    shared = len(ids_a) if d is None else d  # positions with equal tokens
    # The chosen-token logprobs are comparable where the tokens agree.
    chosen = [abs(x - y) for x, y in zip(a["logprobs"][:shared], b["logprobs"][:shared], strict=False)]
    # Top logprobs are comparable up to and including the divergence: the context is still the same there.
    upto = min(shared + 1, len(a["top_logprobs"]), len(b["top_logprobs"]))
    top = []
    top_overlap = []
    first_top = None  # the first generated token: the context is the prompt alone, whatever the tokens do later
    for i, (pa, pb) in enumerate(zip(a["top_logprobs"][:upto], b["top_logprobs"][:upto], strict=False)):
        da, db = dict(pa), dict(pb)
        common = da.keys() & db.keys()
        diffs = [abs(da[t] - db[t]) for t in common]
        top += diffs
        if i == 0 and diffs:
            first_top = max(diffs)
        if da or db:
            top_overlap.append(len(common) / max(len(da), len(db)))
    return {
        "tokens": len(ids_a),
        # Dummy-like weights fall into 2-cycles; many distinct tokens say the outputs depend on the context.
        "distinct_tokens": len(set(ids_a)),
        "nonfinite_logprobs": sum(not math.isfinite(x) for r in (a, b) for x in _logprob_values(r)),
        "tokens_equal": d is None,
        "first_divergence": d,
        "max_abs_logprob_diff": max(chosen) if chosen else None,
        "mean_abs_logprob_diff": sum(chosen) / len(chosen) if chosen else None,
        "max_abs_top_logprob_diff": max(top) if top else None,
        "first_token_top_logprob_diff": first_top,
        "min_top_overlap": min(top_overlap) if top_overlap else None,
    }


def _logprob_values(result: dict) -> list[float]:
    """Every logprob of one result: the chosen tokens' and the top ones'."""
    return [*result["logprobs"], *(lp for position in result["top_logprobs"] for _, lp in position)]


def worst(values) -> float | None:
    """The largest of `values`; NaN if any is NaN (max() would keep or drop a NaN by its position); None if none."""
    values = list(values)
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=None)


def compare_runs(ref: dict, other: dict) -> dict:
    """`ref` and `other` are compare.py records (or their "compare" parts) of the same prompts."""
    ra, rb = ref.get("compare", ref), other.get("compare", other)
    for key in ("seed", "prompt_lens", "max_new_tokens"):
        if ra.get(key) != rb.get(key):
            raise ValueError(f"the runs used different {key}: {ra.get(key)!r} vs {rb.get(key)!r}")
    rows = []
    for name in ra["sets"]:
        if name not in rb["sets"]:
            raise ValueError(f"request set {name!r} is in one run only")
        if len(ra["sets"][name]) != len(rb["sets"][name]):
            raise ValueError(f"request set {name!r}: {len(ra['sets'][name])} vs {len(rb['sets'][name])} results")
        for i, (a, b) in enumerate(zip(ra["sets"][name], rb["sets"][name], strict=False)):
            rows.append({"set": name, "request": i, "prompt_len": ra["prompt_lens"][i], **compare_request(a, b)})
    diffs = [r["max_abs_logprob_diff"] for r in rows if r["max_abs_logprob_diff"] is not None]
    return {
        "reference": ref.get("kernels", "a"), "other": other.get("kernels", "b"),
        "requests": len(rows),
        "tokens_equal": sum(r["tokens_equal"] for r in rows),
        "max_abs_logprob_diff": max(diffs) if diffs else None,
        "rows": rows,
    }


def identical(a: dict, b: dict) -> bool:
    """Two results of the same request are the same tensors: every token, every chosen-token logprob and every
    top logprob (token and value) equal, value for value (JSON keeps a float's exact value)."""
    return (a["output_ids"] == b["output_ids"] and a["logprobs"] == b["logprobs"]
            and a["top_logprobs"] == b["top_logprobs"])


def repeat_check(first: dict[str, list[dict]], again: dict[str, list[dict]]) -> dict:
    """The repeatability gate's evidence: per request set, the same requests served twice by one server, compared
    as tensors (identical) and, where they differ, by how much (compare_request)."""
    sets = {}
    for name, results in first.items():
        if name not in again or len(again[name]) != len(results):
            raise ValueError(f"request set {name!r}: {len(results)} results first, "
                             f"{len(again.get(name, []))} the second time")
        rows = []
        for i, (a, b) in enumerate(zip(results, again[name], strict=True)):
            rows.append({"request": i, "identical": identical(a, b), **compare_request(a, b)})
        sets[name] = {"requests": len(rows), "identical": sum(r["identical"] for r in rows), **set_figures(rows),
                      "rows": rows}
    return {"sets": sets}


def gate_from_passes(compare: dict) -> dict:
    """The V4 gate's evidence from SGLang's own compare record: the last two passes ("sets" and "repeats")
    compared as tensors (repeat_check) and, where a warm-up pass ran, the warm-up against the first compared pass
    ("warmup"), so the record shows whether the warm-up changed anything; each pass's seconds ("pass_s")."""
    gate = repeat_check(compare["sets"], compare["repeats"])
    gate["gated"] = "2 vs 3" if "warmup" in compare else "1 vs 2"
    if "warmup" in compare:
        gate["warmup"] = repeat_check(compare["warmup"], compare["sets"])["sets"]
    gate["pass_s"] = compare.get("pass_s")
    return gate


def set_figures(rows: list[dict]) -> dict:
    """One request set's differences between two passes (compare_request rows): the earliest token at which
    any request's tokens diverge (None: all equal), the largest chosen-token |dlogprob| on a shared prefix
    (None: no request has one, e.g. all diverge at token 0), and the largest top-logprob difference at the first
    generated token (comparable even then: its context is the prompt alone)."""
    divergences = [r["first_divergence"] for r in rows if r["first_divergence"] is not None]
    chosen = [r["max_abs_logprob_diff"] for r in rows if r["max_abs_logprob_diff"] is not None]
    first = [r["first_token_top_logprob_diff"] for r in rows if r.get("first_token_top_logprob_diff") is not None]
    return {"first_divergence": min(divergences) if divergences else None,
            "max_abs_logprob_diff": max(chosen) if chosen else None,
            "max_first_token_top_logprob_diff": max(first) if first else None}


def gate_table(gate: dict) -> str:
    """One line per request set and pair of passes (the gated pair, and the warm-up pass against the first gated
    one where there was a warm-up): how many requests repeated as identical tensors, and by how much the rest
    differed (set_figures)."""
    pairs = [(gate.get("gated", "2 vs 3" if "warmup" in gate else "1 vs 2"), gate["sets"])]
    if "warmup" in gate:
        pairs.append(("1 (warm-up) vs 2", gate["warmup"]))
    rows = []
    for passes, sets in pairs:
        for name, st in sets.items():
            different = [r for r in st["rows"] if not r["identical"]]
            rows.append([name, passes, f"{st['identical']}/{st['requests']}", _fmt(st.get("first_divergence")),
                         _fmt(st["max_abs_logprob_diff"]), _fmt(st.get("max_first_token_top_logprob_diff")),
                         "-" if not different else difference_text(different[0])])
    return render(["set", "passes", "identical tensors", "first divergence", "max |dlogprob| (shared prefix)",
                   "max top |dlogprob| at token 0", "first differing request"], rows)


def difference_text(row: dict) -> str:
    """How one request differed between two passes (a compare_request row), in words. Diverging at token 0
    leaves no shared prefix for the chosen-token logprobs: then the first token's top logprobs say how far."""
    d = row["first_divergence"]
    where = f"request {row.get('request', '?')}: "
    first = _fmt(row.get("first_token_top_logprob_diff"))
    if d is None:
        return where + (f"same tokens, chosen-token |dlogprob| up to {_fmt(row['max_abs_logprob_diff'])}, "
                        f"top logprobs at token 0 up to {first}")
    if d == 0:
        return where + (f"tokens differ from the first generated token on (no shared prefix); the top logprobs "
                        f"there differ by up to {first}")
    return where + (f"tokens diverge at token {d}; largest |dlogprob| on the shared prefix "
                    f"{_fmt(row['max_abs_logprob_diff'])}, top logprobs at token 0 up to {first}")


def _fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def compare_table(result: dict) -> str:
    header = ["set", "request", "prompt tokens", "new tokens", "distinct", "tokens equal", "first divergence",
              "max |dlogprob| (chosen)", "max |dlogprob| (top)", "top overlap"]
    rows = [[r["set"], str(r["request"]), str(r["prompt_len"]), str(r["tokens"]), str(r["distinct_tokens"]),
             "yes" if r["tokens_equal"] else "no", _fmt(r["first_divergence"]), _fmt(r["max_abs_logprob_diff"]),
             _fmt(r["max_abs_top_logprob_diff"]), _fmt(r["min_top_overlap"], ".2f")] for r in result["rows"]]
    summary = (f"{result['other']} vs {result['reference']}: {result['tokens_equal']}/{result['requests']} requests "
               f"with equal tokens; largest |dlogprob| on the shared prefix {_fmt(result['max_abs_logprob_diff'])}")
    nonfinite = sum(r["nonfinite_logprobs"] for r in result["rows"])
    if nonfinite:
        summary += f"; {nonfinite} logprobs are NaN or infinite"
    return render(header, rows) + "\n" + summary


def bench_table(benches: dict[str, dict]) -> str:
    """'kernels | batch | context | tokens/s | ms per step' for each kernel choice's bench rows (with the
    median of the server's own logged decode throughput for that batch size, and whether those steps ran
    in a CUDA graph), and with both choices a side-by-side table of the same (batch, context)."""
    header = ["kernels", "batch", "context", "tokens/s", "ms per step", "ttft s", "server's tokens/s", "graph"]
    rows = []
    for kernels, bench in benches.items():
        mark = " (recording)" if bench.get("recording") else ""
        for r in bench["rows"]:
            logged = r.get("server_log") or {}
            figures = sorted(logged.get("gen_throughput") or [])
            server = f"{figures[len(figures) // 2]:.1f}" if figures else "-"
            graph = ", ".join(logged.get("graph") or []) or "-"
            if "error" in r:
                rows.append([kernels + mark, str(r["batch"]), str(r["context"]), "-", "-", r["error"], server, graph])
                continue
            rows.append([kernels + mark, str(r["batch"]), str(r["context"]), f"{r['tokens_per_s']:.1f}",
                         f"{r['ms_per_step']:.3f}", f"{r['ttft_s']:.3f}", server, graph])
    rows.sort(key=lambda r: (int(r[2]), int(r[1]), r[0]))
    table = render(header, rows)
    if {"sglang", "pdserve"} <= benches.keys():
        table += "\n\n" + _side_by_side(benches["sglang"]["rows"], benches["pdserve"]["rows"])
    return table


def _side_by_side(ref: list[dict], other: list[dict]) -> str:
    by_key = {(r["batch"], r["context"]): r for r in other if "error" not in r}
    rows = []
    for r in ref:
        o = by_key.get((r["batch"], r["context"]))
        if "error" in r or o is None:
            continue
        rows.append([str(r["batch"]), str(r["context"]), f"{r['ms_per_step']:.3f}", f"{o['ms_per_step']:.3f}",
                     f"{r['ms_per_step'] / o['ms_per_step']:.2f}x"])
    rows.sort(key=lambda row: (int(row[1]), int(row[0])))
    return render(["batch", "context", "sglang ms/step", "pdserve ms/step", "sglang / pdserve"], rows)


def summarize_records(directory: Path) -> list[dict]:
    """The plugin's shadow comparison (PDSERVE_DSA_RECORD_DIR: records-<pid>.jsonl, one JSON line per
    eager decode call of an op in a layer, pdserve's result against SGLang's kernel on the same inputs),
    folded per (op, variant, layer): worst and mean figures over the calls. Also records-<pid>.jsonl.gz: the
    committed runs keep their records gzipped (a tenth of the size; the working tree travels with every device
    call beside a wheel chunk, 64 MiB in all)."""
    groups: dict[tuple, list[dict]] = {}
    for path in sorted([*directory.glob("records-*.jsonl"), *directory.glob("records-*.jsonl.gz")]):
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        for line in text.splitlines():
            if line.strip():
                r = json.loads(line)
                groups.setdefault((r["op"], r.get("variant", ""), r["layer"]), []).append(r)
    rows = []
    for (op, variant, layer), recs in sorted(groups.items()):
        row = {"op": op, "variant": variant, "layer": layer, "calls": len(recs), "rows": sum(r["rows"] for r in recs)}
        if op == "indexer_topk":
            overlaps = [r["overlap_min"] for r in recs]
            row.update(overlap_min=math.nan if any(math.isnan(v) for v in overlaps) else min(overlaps),
                       overlap_mean=sum(r["overlap_mean"] for r in recs) / len(recs),
                       rows_identical_sets=sum(r["rows_identical_sets"] for r in recs),
                       # Recorded since 2026-12-07; a summary of older records leaves them out (not judged).
                       **{k: sum(r[k] for r in recs) for k in ("rows_with_repeats", "rows_selecting_another_count")
                          if all(k in r for r in recs)},
                       longest=max((max(r["lengths"]) for r in recs if r["lengths"]), default=0))
        else:
            row.update(rel_l2_max=worst(r["rel_l2"] for r in recs),
                       rel_l2_worst_row=worst(r["rel_l2_worst_row"] for r in recs),
                       max_abs=worst(r["max_abs"] for r in recs), nonfinite=sum(r["nonfinite"] for r in recs))
            exact = [r for r in recs if "rel_l2_ours_vs_fp32" in r]  # the fp32 reference of the first rows
            if exact:
                row.update(exact_rows=sum(r["exact_rows"] for r in exact),
                           ours_vs_fp32_max=worst(r["rel_l2_ours_vs_fp32"] for r in exact),
                           sglang_vs_fp32_max=worst(r["rel_l2_sglang_vs_fp32"] for r in exact))
        rows.append(row)
    return rows


def records_table(rows: list[dict]) -> str:
    header = ["op", "layer", "calls", "rows", "identical top-k sets", "min overlap", "rel L2 (max call)",
              "rel L2 (worst row)", "max |diff|", "non-finite"]
    out = []
    for r in rows:
        name = r["op"] + (f" ({r['variant']})" if r["variant"] else "")
        if r["op"] == "indexer_topk":
            out.append([name, str(r["layer"]), str(r["calls"]), str(r["rows"]),
                        f"{r['rows_identical_sets']}/{r['rows']}", f"{r['overlap_min']:.4f}", "-", "-", "-", "-"])
        else:
            out.append([name, str(r["layer"]), str(r["calls"]), str(r["rows"]), "-", "-", _fmt(r["rel_l2_max"]),
                        _fmt(r["rel_l2_worst_row"]), _fmt(r["max_abs"]), str(r["nonfinite"])])
    table = render(header, out)
    exact = [r for r in rows if "exact_rows" in r]
    if exact:
        table += "\n\n" + render(
            ["op", "layer", "rows vs fp32", "pdserve rel L2 vs fp32 (max)", "SGLang rel L2 vs fp32 (max)"],
            [[r["op"] + (f" ({r['variant']})" if r["variant"] else ""), str(r["layer"]), str(r["exact_rows"]),
              _fmt(r["ours_vs_fp32_max"]), _fmt(r["sglang_vs_fp32_max"])] for r in exact])
    return table


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", type=Path,
                   help="OUT_DIR; or OUT1 OUT2, the plugin-off call's and the plugin-on call's; or two compare JSON "
                        "files (reference first)")
    p.add_argument("--max-logprob-diff", type=float, default=None,
                   help="exit 1 if a chosen-token logprob differs by more than this on a shared prefix")
    p.add_argument("--require-equal-tokens", action="store_true", help="exit 1 unless every request's tokens are equal")
    p.add_argument("--records", type=Path, default=None,
                   help="also summarize the plugin's shadow-comparison records in this directory (records-*.jsonl)")
    p.add_argument("--strict-gate", action="store_true",
                   help="V4: fail unless SGLang's own server repeated itself (as compare.py --strict-gate)")
    args = p.parse_args(argv)
    if args.records is not None:
        print(records_table(summarize_records(args.records)))
    dirs = [x for x in args.paths if x.is_dir()]
    if len(args.paths) in (1, 2) and len(dirs) == len(args.paths):
        off_dir, on_dir = dirs[0], dirs[-1]
        pair = [off_dir / "compare-sglang.json", on_dir / "compare-pdserve.json"]
        benches = {k: _load(d / f"bench-{k}.json")["bench"] for k, d in (("sglang", off_dir), ("pdserve", on_dir))
                   if (d / f"bench-{k}.json").exists()}
    elif len(args.paths) == 2 and not dirs:
        off_dir = on_dir = None
        pair, benches = args.paths, {}
    else:
        p.error("give one results directory, two (the plugin-off call's, then the plugin-on call's), or two "
                "compare JSON files")
    runs = {k: _load(x) for k, x in zip(("sglang", "pdserve"), pair, strict=True) if x.exists()}
    if not runs and not benches:
        p.error(f"not found: {', '.join(map(str, pair))}")
    failed = False
    result = None
    if len(runs) == 2:
        result = compare_runs(runs["sglang"], runs["pdserve"])
        print(compare_table(result))
        if args.require_equal_tokens and result["tokens_equal"] != result["requests"]:
            print(f"FAIL: tokens differ in {result['requests'] - result['tokens_equal']} requests")
            failed = True
        worst = result["max_abs_logprob_diff"]
        if args.max_logprob_diff is not None and worst is not None and worst > args.max_logprob_diff:
            print(f"FAIL: largest |dlogprob| {worst:.4f} > {args.max_logprob_diff}")
            failed = True
    if benches:
        print(bench_table(benches))
    if off_dir is not None and any(r.get("arch") == "v4" for r in runs.values()):
        failed |= _v4_verdict(runs, off_dir, on_dir, result, strict_gate=args.strict_gate,
                              both=len(args.paths) == 2)
    elif off_dir is not None and (off_dir / "gate.json").exists():  # a V4 record from before records named arch
        # Recomputed from the passes where they are here: the figures added since are then in the table too.
        passes = runs.get("sglang", {}).get("compare", {})
        print(gate_table(gate_from_passes(passes) if "repeats" in passes else _load(off_dir / "gate.json")))
    return 1 if failed else 0


def _v4_verdict(runs: dict[str, dict], off_dir: Path, on_dir: Path, result: dict | None, *, strict_gate: bool,
                both: bool) -> bool:
    """compare.py's V4 verdict again, from the files of one call or of two (the plugin-off call's gate.json, the
    plugin-on call's records summary; `both`: two were named, and each must have left its compare record); prints
    it and says whether it failed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for `tests.gpu.dsa`
    from tests.gpu.dsa import verdict

    gate = _load(off_dir / "gate.json") if (off_dir / "gate.json").exists() else None
    if gate is not None:
        print(gate_table(gate))
    summary = on_dir / "records-summary-pdserve.json"
    records = _load(summary)["rows"] if summary.exists() else None
    if records:
        print(records_table(records))
    config = next(r["model_config"] for r in runs.values() if "model_config" in r)
    failures, notes = verdict.v4_verdict(runs, gate, records, result, config, strict_gate=strict_gate, both=both)
    for note in notes:
        print(f"NOTE: {note}")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return bool(failures)


if __name__ == "__main__":
    sys.exit(main())
