"""Decode step time of a deeper tiny DeepSeek model with SGLang's sparse-attention kernels against pdserve's: two
real SGLang servers on one GPU, measured in alternated order, in one device call (issue 38, item 5).

    python3 tests/gpu/dsa/steps.py --arch v4|dsa --model DIR --out DIR [--points B:C,...] [--rounds N]
        [--new-tokens N] [--profile-steps N]

Why two servers side by side: a server's kernel choice is fixed when it starts (the plugin patches SGLang's
functions in each scheduler process and the decode CUDA graphs capture what ran), and a server takes minutes to
start. With both up, the rounds alternate (off then on, on then off, ...), so drift over the call (clocks,
temperature) falls on both alike; only one server works at a time, the other idles.

Memory: both take the arch's --mem-fraction-static; SGLang 0.5.17 sizes its KV pool from the memory free when it
starts, so the second starts once the first has its pool (server.start_side_by_side) and takes that fraction of
what is left.

Per point (B concurrent streams of C-token prompts, greedy, ignore_eos, N new tokens): one warm-up round per server
(JIT for the shapes, and the prefix cache takes the prompts, so later rounds prefill only the uncached tail), then
`--rounds` rounds measuring both servers in alternated order; ms per decode step over the window in which all B
streams decode (client.decode_figures). Then, with --profile-steps, one profiled round per server: SGLang's own
/start_profile by stage (GPU activity only) over that many decode steps; the trace's kernels are summed per name and
those of the sparse attention (sparse MLA decode, indexer logits, top-k: what the plugin replaces) give their share
of the step. Written to --out: steps.json (every round, the summaries, the profiles' top kernels) and the table on
stdout. Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for `tests.gpu.dsa`

from tests.gpu.dsa import client, compare, server, verdict

KERNELS = ("sglang", "pdserve")  # the order of the first round; later rounds alternate
# 16K-token prompts: the DSA tier's bench went to 12K; V4's C4 top-512 selects from 2048 tokens on, V3.2's top-2048
# from 2048. The B = 1 prompt is the first of B = 8's, so each server prefills 8 x 16K tokens once, in its warm-up.
DEFAULT_POINTS = {"v4": "1:16384,8:16384", "dsa": "1:16384,8:16384"}
# Larger prefill chunks than the compare runs' 4096: the warm-up rounds prefill 128K tokens per server.
PREFILL_CHUNK = ["--chunked-prefill-size", "16384"]
DEFAULT_CONTEXT_LENGTH = 65536  # both configs' rope scaling covers it (V4: max_position_embeddings 65536)
# The kernels the plugin replaces, by op, named as either side launches them (the first GPU run's profiles, 2026-12-06):
# sparse MLA decode: FlashMLA's split-KV decode, its combine and its schedule metadata, or pdserve's sparse_mla_*;
# indexer: DeepGEMM's paged MQA logits and their metadata, or pdserve's dsa_*; top-k: SGLang's top-k kernels. Names
# with "rope" are the fused norm + RoPE kernels that write the FlashMLA cache layout: not attention, not replaced.
ATTENTION_GROUPS = {
    "mla": re.compile(r"sparse_mla|splitkv_mla|mla_combine|get_mla_metadata", re.I),
    "indexer": re.compile(r"mqa_logits|dsa_indexer|dsa_score|dsa_fused", re.I),
    "topk": re.compile(r"topk|top_k|dsa_select", re.I),
}
NOT_ATTENTION = re.compile(r"rope", re.I)


def attention_group(name: str) -> str | None:
    """Which replaced op a kernel belongs to (None: not one the plugin replaces)."""
    if NOT_ATTENTION.search(name):
        return None
    return next((group for group, pattern in ATTENTION_GROUPS.items() if pattern.search(name)), None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="tiny_v4_model.py / tiny_dsa_model.py DIR --layers N")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arch", choices=server.ARCHS, default="v4")
    p.add_argument("--points", type=points, default=None,
                   help="B:C pairs, comma-separated: B concurrent streams of C-token prompts (default 1:16384,8:16384)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per point, each both servers (default 3)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per stream and round")
    p.add_argument("--profile-steps", type=int, default=32,
                   help="decode steps of the profiled round per server and point; 0: no profile")
    p.add_argument("--profile-dir", type=Path, default=Path("/tmp/pdserve-steps-profile"),
                   help="where SGLang writes its traces (read, summarized into steps.json, and removed)")
    p.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH)
    p.add_argument("--port", type=int, default=30000, help="the plugin-off server's port")
    p.add_argument("--second-port", type=int, default=None, help="the plugin-on server's port (default --port + 100)")
    p.add_argument("--ready-timeout", type=float, default=420.0, help="seconds for one server start")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds for one round's streams")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the two server commands and exit")
    args = p.parse_args(argv)
    if args.points is None:
        args.points = points(DEFAULT_POINTS[args.arch])
    if args.rounds < 1:
        p.error(f"--rounds: need at least 1, got {args.rounds}")
    if args.new_tokens < 8:
        p.error(f"--new-tokens: need at least 8 for a decode window, got {args.new_tokens}")
    if args.profile_steps < 0 or args.profile_steps >= args.new_tokens:
        p.error(f"--profile-steps: 0 to {args.new_tokens - 1} (fewer than --new-tokens), got {args.profile_steps}")
    longest = max(c for _, c in args.points) + args.new_tokens
    if longest > args.context_length:
        p.error(f"a prompt plus its new tokens ({longest}) exceeds --context-length {args.context_length}")
    return args


def points(text: str) -> list[tuple[int, int]]:
    """'1:32768,8:32768' -> [(1, 32768), (8, 32768)]."""
    found = []
    for part in (t.strip() for t in text.split(",")):
        batch, sep, context = part.partition(":")
        try:
            pair = (int(batch), int(context))
        except ValueError:
            pair = (0, 0)
        if not sep or pair[0] < 1 or pair[1] < 1:
            raise argparse.ArgumentTypeError(f"not a B:C pair of positive integers: {part!r} in {text!r}")
        found.append(pair)
    return found


def graph_batches(pairs: list[tuple[int, int]]) -> tuple[int, ...]:
    """Decode CUDA graphs for exactly the measured batch sizes: each is replayed, none padded, and the start
    compiles no kernel for a batch nobody measures."""
    return tuple(sorted({b for b, _ in pairs}))


def round_orders(rounds: int) -> list[tuple[str, str]]:
    """Which server goes first in each round: off, on; then on, off; ... (ABBA), so neither always goes first."""
    return [KERNELS if r % 2 == 0 else KERNELS[::-1] for r in range(rounds)]


def gpu_memory(timeout: float = 30.0) -> dict:
    """Used and total bytes of GPU 0 from nvidia-smi, for the record (the reason where it could not be read)."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                               "-i", "0"], capture_output=True, text=True, timeout=timeout, check=True).stdout
        used, total = (int(v) * 2**20 for v in text.strip().split(","))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": repr(exc)[:200]}
    return {"used": used, "total": total}


def spread(values: list[float]) -> dict:
    """Median and range of one server's rounds."""
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize_point(rows: list[dict]) -> dict:
    """The measured rounds of one point: per server the median and range of ms/step, the ratio of the medians
    (pdserve / SGLang: below 1 the plugin is faster) and the ratio within each round (adjacent measurements)."""
    by = {k: [r["ms_per_step"] for r in rows if r["kernels"] == k and "ms_per_step" in r] for k in KERNELS}
    if not all(by.values()):
        return {"error": "a server has no measured round", "rounds": len(rows)}
    per_round: dict[int, dict[str, float]] = {}
    for r in rows:
        if "ms_per_step" in r:
            per_round.setdefault(r["round"], {})[r["kernels"]] = r["ms_per_step"]
    paired = [v["pdserve"] / v["sglang"] for v in per_round.values() if len(v) == 2]
    return {**{k: spread(v) for k, v in by.items()},
            "ratio_of_medians": statistics.median(by["pdserve"]) / statistics.median(by["sglang"]),
            "paired_ratios": paired}


def kernel_totals(trace: dict) -> dict[str, dict]:
    """Per kernel name, total microseconds and launches, from a torch profiler chrome trace (GPU activity)."""
    totals: dict[str, dict] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        entry = totals.setdefault(str(event.get("name", "?")), {"us": 0.0, "count": 0})
        entry["us"] += float(event.get("dur", 0.0))
        entry["count"] += 1
    return totals


def graph_launches(trace: dict) -> int:
    """cudaGraphLaunch calls in the trace: one per decode step that replayed a CUDA graph."""
    return sum(1 for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")


def profile_summary(trace: dict, steps_asked: int) -> dict:
    """Kernel time per decode step, per replaced op and in all. Steps: the trace's graph launches where there are any
    (one per replayed step), else the steps asked for. Kernels of several streams overlap, so their sum can exceed
    the step's wall time: shares are of kernel time. Every kernel is kept (a few dozen names), so a reader can
    regroup them."""
    totals = kernel_totals(trace)
    launches = graph_launches(trace)
    steps = launches or steps_asked
    all_us = sum(t["us"] for t in totals.values())
    groups = dict.fromkeys(ATTENTION_GROUPS, 0.0)
    for name, t in totals.items():
        group = attention_group(name)
        if group:
            groups[group] += t["us"]
    attention_us = sum(groups.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1]["us"])
    return {"steps": steps, "graph_launches": launches, "steps_asked": steps_asked, "kernels": len(totals),
            "kernel_us_per_step": all_us / steps if steps else None,
            "attention_us_per_step": attention_us / steps if steps else None,
            "group_us_per_step": {g: (us / steps if steps else None) for g, us in groups.items()},
            "attention_share_of_kernel_time": attention_us / all_us if all_us else None,
            "all": [{"name": n[:200], "us": round(t["us"], 1), "count": t["count"], "group": attention_group(n)}
                    for n, t in ranked]}


def measure(srv: server.Server, ids: list[list[int]], new_tokens: int, timeout: float) -> dict:
    """One round on one server: all streams at once; the decode figures of the common window."""
    sent = time.perf_counter()
    timelines = client.concurrent_timelines(srv.url, ids, max_new_tokens=new_tokens, timeout=timeout)
    try:
        fig = client.decode_figures(timelines, sent)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"ms_per_step": round(fig.ms_per_step, 4), "tokens_per_s": round(fig.tokens_per_s, 1),
            "steps_in_window": round(fig.steps, 1), "window_s": round(fig.window_s, 3), "ttft_s": round(fig.ttft_s, 3)}


def profile_round(srv: server.Server, ids: list[list[int]], args: argparse.Namespace, directory: Path,
                  profile_id: str) -> dict:
    """A round under SGLang's profiler: by stage, so the decode steps get their own trace, GPU activity only."""
    directory.mkdir(parents=True, exist_ok=True)
    request = {"output_dir": str(directory), "num_steps": args.profile_steps, "activities": ["GPU"],
               "profile_by_stage": True, "with_stack": False, "record_shapes": False, "profile_id": profile_id}
    client.post_text(srv.url + "/start_profile", request, timeout=30.0)
    measure(srv, ids, args.new_tokens, args.request_timeout)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:  # the trace is written after the last profiled step; exporting takes seconds
        traces = sorted(directory.glob(f"{profile_id}*DECODE*.trace.json.gz"))
        if traces:
            time.sleep(2.0)  # let the writer finish the file it has just created
            with gzip.open(traces[0], "rt", encoding="utf-8") as f:
                trace = json.load(f)
            for written in directory.glob(f"{profile_id}*.trace.json.gz"):  # tens of MB; the summary travels back
                written.unlink()
            return profile_summary(trace, args.profile_steps)
        time.sleep(1.0)
    return {"error": f"no decode trace {profile_id}*DECODE*.trace.json.gz in {directory} within 60 s"}


def make_pair(args: argparse.Namespace) -> dict[str, server.Server]:
    graphs = graph_batches(args.points)
    ports = (args.port, args.second_port or args.port + 100)
    return {kernels: server.make_server(args.model, ports[i], kernels,
                                        args.out / f"server-steps-{kernels}.log", graph_bs=graphs, arch=args.arch,
                                        radix_cache=True, context_length=args.context_length, extra=PREFILL_CHUNK)
            for i, kernels in enumerate(KERNELS)}


def run_points(pair: dict[str, server.Server], args: argparse.Namespace, record: dict) -> None:
    vocab = compare.vocab_size(args.model)
    longest = max(c for _, c in args.points)
    widest = max(b for b, _ in args.points)
    # One prompt set for every point: B streams take the first B prompts, truncated to C, so after the warm-ups the
    # prefix cache holds every point's prompts and a round prefills almost nothing.
    prompts = client.prompts(args.seed, [longest] * widest, vocab)
    for batch, context in args.points:
        ids = [p[:context] for p in prompts[:batch]]
        point: dict = {"batch": batch, "context": context, "new_tokens": args.new_tokens, "rounds": []}
        record["points"].append(point)
        for kernels in KERNELS:
            t = time.monotonic()
            point.setdefault("warmup", {})[kernels] = {**measure(pair[kernels], ids, args.new_tokens,
                                                                 args.request_timeout),
                                                       "s": round(time.monotonic() - t, 1)}
        for r, order in enumerate(round_orders(args.rounds)):
            for kernels in order:
                row = {"round": r, "kernels": kernels, **measure(pair[kernels], ids, args.new_tokens,
                                                                 args.request_timeout)}
                point["rounds"].append(row)
                print(f"  B={batch} C={context} round {r} {kernels}: "
                      f"{row.get('ms_per_step', row.get('error'))} ms/step", flush=True)
        point["summary"] = summarize_point(point["rounds"])
        if args.profile_steps:
            for kernels in KERNELS:
                try:
                    point.setdefault("profile", {})[kernels] = profile_round(
                        pair[kernels], ids, args, args.profile_dir, f"steps-{kernels}-b{batch}-c{context}")
                except Exception as exc:  # noqa: BLE001 - a failed profile leaves the timings standing
                    point.setdefault("profile", {})[kernels] = {"error": repr(exc)[:300]}
        _write(args.out / "steps.json", record)


def table(record: dict) -> str:
    """The measurement as a table: per point, both servers' median ms/step and range, the ratio, the profile."""
    lines = ["| batch | context | SGLang ms/step median (range) | pdserve ms/step median (range) | pdserve / SGLang "
             "(per round) | replaced kernels per step, SGLang / pdserve (share of kernel time) |",
             "|---|---|---|---|---|---|"]
    for point in record.get("points", []):
        s = point.get("summary", {})
        if "error" in s or not s:
            lines.append(f"| {point['batch']} | {point['context']} | {s.get('error', 'not measured')} | | | |")
            continue
        cells = [f"{s[k]['median']:.3f} ({s[k]['min']:.3f}-{s[k]['max']:.3f})" for k in KERNELS]
        paired = ", ".join(f"{v:.3f}" for v in s["paired_ratios"])
        shares = []
        for k in KERNELS:
            prof = point.get("profile", {}).get(k, {})
            us, share = prof.get("attention_us_per_step"), prof.get("attention_share_of_kernel_time")
            shares.append(f"{us:.0f} us ({share:.0%})" if us is not None and share is not None else
                          prof.get("error", "-")[:60])
        lines.append(f"| {point['batch']} | {point['context']} | {cells[0]} | {cells[1]} | "
                     f"{s['ratio_of_medians']:.3f} ({paired}) | {' / '.join(shares)} |")
    return "\n".join(lines)


def plugin_problems(plugin: dict[str, list]) -> list[str]:
    """What keeps the plugin-on server from measuring pdserve's kernels: no status line, an op its status gave to
    pdserve that never ran, a fallback."""
    if not plugin["status"]:
        return ["the plugin-on server logged no plugin status line"]
    asked = {op for status in plugin["status"] for op, kernels in (status.get("kernels") or {}).items()
             if kernels == "pdserve"}
    ran = {r.get("op") for r in plugin["ran"]}
    problems = [f"{op}: the status gave it to pdserve, but pdserve's kernel never ran" for op in sorted(asked - ran)]
    problems += [f"fallback: {f}" for f in plugin["fallback"][:3]]
    if not asked:
        problems.append(f"the plugin-on server's status gave no op to pdserve: {plugin['status'][0]}")
    return problems


def point_problems(points: list[dict]) -> list[str]:
    """A point not measured, or a round that failed (its medians would stand on the rounds left)."""
    problems = []
    for p in points:
        where = f"B={p['batch']} C={p['context']}"
        summary = p.get("summary", {"error": "not measured"})
        if "error" in summary:
            problems.append(f"{where}: {summary['error']}")
        failed = [r for r in p.get("rounds", []) if "ms_per_step" not in r]
        if failed:
            problems.append(f"{where}: {len(failed)} of {len(p['rounds'])} rounds failed (first: round "
                            f"{failed[0]['round']} {failed[0]['kernels']}: {failed[0].get('error', 'no figure')})")
    return problems


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pair = make_pair(args)
    if args.dry_run:
        for kernels, srv in pair.items():
            print(f"{kernels}: {' '.join(f'{k}={v}' for k, v in srv.env.items())} {' '.join(srv.argv)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # through the finally that stops both servers
    record: dict = {"arch": args.arch, "model_config": compare.model_config(args.model), "versions": compare.versions(),
                    "plugin_entry_points": compare.plugin_entry_points(), "rounds": args.rounds,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "ready_after_s": {},
                    "argv": {}, "env": {}, "points": []}
    if not record["plugin_entry_points"]:
        raise SystemExit(f"no {compare.PLUGIN_GROUP} entry point is installed: the plugin-on server would run "
                         "SGLang's kernels")
    for kernels, srv in pair.items():
        record["argv"][kernels], record["env"][kernels] = srv.argv, srv.env
        print(f"[{kernels}] starting: {' '.join(srv.argv)}", flush=True)
    try:
        ready = server.start_side_by_side(list(pair.values()), args.ready_timeout)
        for kernels, seconds in zip(pair, ready, strict=True):
            record["ready_after_s"][kernels] = round(seconds, 1)
            print(f"[{kernels}] ready after {seconds:.1f} s", flush=True)
            findings = compare.log_findings(pair[kernels], args.arch)
            if findings["unknown_weights"]:
                raise SystemExit(f"[{kernels}] SGLang ignored checkpoint tensors or left parameters unloaded: "
                                 f"{findings['unknown_weights'][:3]}")
        record["gpu_memory_both_ready"] = gpu_memory()
        run_points(pair, args, record)
    finally:
        for srv in pair.values():
            srv.stop()
        for kernels, srv in pair.items():
            record.setdefault("plugin", {})[kernels] = compare.log_findings(srv, args.arch)["plugin"]
        _write(args.out / "steps.json", record)
    for kernels in KERNELS:
        print(f"[{kernels}] {compare.plugin_summary(record['plugin'][kernels])}", flush=True)
    print(table(record), flush=True)
    problems = plugin_problems(record["plugin"]["pdserve"])
    # The plugin-off server must have run SGLang's kernels, or the comparison is of pdserve against itself.
    problems += verdict.plugin_failures("sglang", record["plugin"]["sglang"])
    problems += point_problems(record["points"])
    for problem in problems:
        print(f"FAIL: {problem}", flush=True)
    print("DONE" if not problems else f"{len(problems)} problem(s)", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
