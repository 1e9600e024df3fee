"""Serve a tiny DeepSeek model with SGLang's own sparse-attention decode kernels and with pdserve's, and record
what tells them apart: greedy logprobs of the same long prompts, per-layer records, and decode speed.

Run on the GPU machine (tests/gpu/dsa/run_on_device.sh runs it), one server at a time:

    python3 tests/gpu/dsa/compare.py --model DIR --out DIR [--arch dsa|v4] [--phase compare|bench|all]
        [--kernels sglang|pdserve|both] [--record-dir DIR]

For each kernel choice a real `python -m sglang.launch_server` starts (env PDSERVE_DSA_KERNELS=...),
is gated on its ready line, runs the phases and is stopped. `compare` sends the same seeded prompts
(all longer than index_topk = 2048, so the top-k selects) one at a time and then all in one call,
greedy, with logprobs and top logprobs, and writes compare-<kernels>.json; `bench` streams B
concurrent requests of context C and writes bench-<kernels>.json and a table. With both kernel choices
the comparison (diff.py) is printed at the end. Server logs go to --out. Every wait has a deadline.

`--arch v4` (the tiny DeepSeek-V4 of tiny_v4_model.py; compare phase only) first measures whether SGLang repeats
itself: its own server (plugin off) serves the request sets once to warm up (JIT compiles, autotuning) and then
twice more, and the logprob tensors of passes 2 and 3 are compared value for value (gate.json, with pass 1 against
2 beside them). Where they differ, their differences are SGLang's noise floor; the run goes on: pdserve's server
(plugin on, recording every eager decode call against SGLang's kernel on the same inputs) serves a warm-up pass
and one more, and verdict.py judges the per-layer records (the proof) and the logprobs off against on against
that floor. `--strict-gate` instead stops at a gate that differs and fails. Both servers decode eagerly (the
plugin records eager calls only), radix cache off.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for `tests.gpu.dsa`

from tests.gpu.dsa import client, diff, server, verdict

PHASES = ("compare", "bench", "all")
# Per architecture: prompts all longer than 4 x index_topk (V4: C4 keeps one entry per 4 tokens, so its
# top-512 selects from 2048 tokens on) or than index_topk (V3.2: 2048); V4 decodes eagerly for the recorder.
ARCH_DEFAULTS = {
    "dsa": {"prompt_lens": [2100, 2600, 3100, 4000, 5000, 6000], "max_new_tokens": 32,
            "graph_bs": list(server.DEFAULT_GRAPH_BS), "min_prompt": 2048, "ready_timeout": 330.0},
    # V4's first start on a bare machine took 283 s in the probe, 206 s of it JIT in the first graph capture;
    # eager, that JIT falls to SGLang's warm-up request, still before the ready line.
    "v4": {"prompt_lens": [2600, 3400, 5000, 7000], "max_new_tokens": 16, "graph_bs": [], "min_prompt": 4 * 512,
           "ready_timeout": 420.0},
}
VERSIONS = ("torch", "sglang", "sglang-kernel", "sgl-deep-gemm", "flashinfer-python", "transformers",
            "pdserve-kernels")
PLUGIN_GROUP = "sglang.srt.plugins"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True,
                   help="the directory tiny_dsa_model.py (or tiny_v4_model.py) wrote")
    p.add_argument("--out", type=Path, required=True, help="results and server logs go here")
    p.add_argument("--arch", choices=server.ARCHS, default="dsa",
                   help="dsa: the tiny DeepSeek-V3.2; v4: the tiny DeepSeek-V4 (repeatability gate, records)")
    p.add_argument("--phase", choices=PHASES, default="compare")
    p.add_argument("--kernels", choices=(*server.KERNELS, "both"), default="both")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--second-port", type=int, default=None,
                   help="--side-by-side: pdserve's server's port (default --port + 100)")
    p.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds for one server start (dsa default 330, v4 default 420)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds for one /generate call")
    p.add_argument("--record-dir", type=Path, default=None,
                   help="PDSERVE_DSA_RECORD_DIR for the servers (one subdirectory per kernel choice): the "
                        "plugin dumps per-layer intermediates; bench figures under it are marked 'recording' "
                        "(--arch v4: default OUT/record)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-lens", type=_ints, default=None,
                   help="compare: prompt lengths in tokens, comma-separated, long enough to make the top-k "
                   "select (dsa default 2100..6000, v4 default 2600,3400,5000,7000)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="dsa default 32, v4 default 16")
    p.add_argument("--top-logprobs", type=int, default=5)
    p.add_argument("--bench-batches", type=_ints, default=[1, 4, 16])
    p.add_argument("--bench-contexts", type=_ints, default=[4096, 12288])
    p.add_argument("--bench-new-tokens", type=int, default=128)
    p.add_argument("--graph-bs", type=_ints, default=None,
                   help="decode CUDA-graph batch sizes; 0 for none (--cuda-graph-backend-decode disabled: all eager); "
                   "dsa default 1,2,4,8,16, v4 default 0")
    p.add_argument("--radix-cache", action="store_true",
                   help="v4: leave SGLang's prefix cache on (only if --disable-radix-cache will not start: the "
                        "probe saw two greedy runs of one prompt diverge with it on)")
    p.add_argument("--strict-gate", action="store_true",
                   help="v4: require SGLang's own server to repeat itself (passes 2 and 3 identical tensors): stop "
                        "and fail if it does not (default: measure its noise floor, go on, and judge the logprobs "
                        "off against on against that floor; the per-layer records judge the kernels either way)")
    p.add_argument("--no-warmup", action="store_true",
                   help="v4: no warm-up pass before the compared ones (the gate then compares passes 1 and 2)")
    p.add_argument("--side-by-side", action="store_true",
                   help="v4 with --kernels both: both servers up at once on the one GPU (the second starts once the "
                        "first has its KV pool), so the two fit one device call; each then serves its passes in turn")
    p.add_argument("--server-arg", action="append", default=[], help="one more launch_server argument (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the server commands and exit")
    args = p.parse_args(argv)
    defaults = ARCH_DEFAULTS[args.arch]
    for key in ("prompt_lens", "max_new_tokens", "graph_bs", "ready_timeout"):
        if getattr(args, key) is None:
            setattr(args, key, list(defaults[key]) if isinstance(defaults[key], list) else defaults[key])
    if args.arch == "v4":
        if args.phase != "compare":
            p.error(f"--phase {args.phase}: --arch v4 runs the compare phase only (the bench is the DSA tier's)")
        if args.record_dir is None:
            args.record_dir = args.out / "record"
    elif args.radix_cache or args.strict_gate or args.no_warmup or args.side_by_side:
        p.error("--radix-cache, --strict-gate, --no-warmup and --side-by-side are --arch v4 options")
    if args.side_by_side and args.kernels != "both":
        p.error(f"--side-by-side runs both servers: --kernels both, not {args.kernels}")
    shortest = defaults["min_prompt"]
    if any(n <= shortest for n in args.prompt_lens):
        p.error(f"--prompt-lens: every prompt must be longer than {shortest} tokens for --arch {args.arch} "
                f"(else the top-k keeps everything), got {args.prompt_lens}")
    contexts = args.bench_contexts if args.phase != "compare" else []
    longest = max(args.prompt_lens + contexts) + max(args.max_new_tokens, args.bench_new_tokens if contexts else 0)
    context_length = server.CONTEXT_LENGTHS[args.arch]
    if longest > context_length:
        p.error(f"a prompt plus its new tokens ({longest}) exceeds the served context length {context_length}")
    if args.graph_bs == [0]:
        args.graph_bs = []
    if args.record_dir is not None and args.graph_bs:
        # The plugin records eager calls only (nothing can be read inside a graph capture or replay).
        print(f"note: --record-dir with decode CUDA graphs for batch {args.graph_bs}: only eager decode steps "
              "(larger batches) are recorded; --graph-bs 0 records every step", file=sys.stderr)
    return args


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"need one or more non-negative integers: {text!r}")
    return values


def kernel_choices(args: argparse.Namespace) -> list[str]:
    return list(server.KERNELS) if args.kernels == "both" else [args.kernels]


def make_servers(args: argparse.Namespace) -> dict[str, server.Server]:
    servers = {}
    for i, kernels in enumerate(kernel_choices(args)):
        record = args.record_dir / kernels if args.record_dir is not None else None
        # One after another they share a port; side by side the second takes its own.
        port = args.port if i == 0 or not args.side_by_side else (args.second_port or args.port + 100)
        servers[kernels] = server.make_server(args.model, port, kernels, args.out / f"server-{kernels}.log",
                                              record_dir=record, graph_bs=tuple(args.graph_bs),
                                              extra=args.server_arg, arch=args.arch, radix_cache=args.radix_cache)
    return servers


def versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def plugin_entry_points() -> list[str]:
    """The `sglang.srt.plugins` entry points this Python (and so each scheduler process) would load."""
    return sorted(f"{ep.name} = {ep.value}" for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP))


def model_config(model: Path) -> dict:
    return json.loads((model / "config.json").read_text(encoding="utf-8"))


def vocab_size(model: Path) -> int:
    return int(model_config(model)["vocab_size"])


def request_sets(srv: server.Server, args: argparse.Namespace, batch: list[list[int]]) -> dict[str, list[dict]]:
    """The prompts one at a time (decode at batch 1), then all in one call (batched decode)."""
    sets: dict[str, list[dict]] = {"sequential": []}
    for ids in batch:
        sets["sequential"] += client.generate(srv.url, [ids], max_new_tokens=args.max_new_tokens,
                                              top_logprobs=args.top_logprobs, timeout=args.request_timeout)
    sets["batch"] = client.generate(srv.url, batch, max_new_tokens=args.max_new_tokens,
                                    top_logprobs=args.top_logprobs, timeout=args.request_timeout)
    return sets


REPEATS = ("sequential", "sets", "none")


def compare_phase(srv: server.Server, args: argparse.Namespace, *, repeat: str = "sequential",
                  warmup: bool = False) -> dict:
    """With `warmup`, both request sets once first (kept as "warmup"; V4: the first pass ran while JIT compiles
    and autotuning happened, so it is not the compared one). Then the seeded prompts one at a time and all in one
    call ("sets"), then `repeat`: "sequential" the one-at-a-time requests again (the DSA tier's noise floor,
    summarized), "sets" both sets again, kept whole for the repeatability gate (V4, SGLang's own server:
    diff.gate_from_passes), "none" nothing (V4, pdserve's server: the gate was SGLang's, and another pass would
    only add recording). "pass_s": each pass's seconds."""
    if repeat not in REPEATS:
        raise ValueError(f"repeat must be one of {REPEATS}, not {repeat!r}")
    batch = client.prompts(args.seed, args.prompt_lens, vocab_size(args.model))
    result: dict = {"seed": args.seed, "prompt_lens": args.prompt_lens, "max_new_tokens": args.max_new_tokens,
                    "top_logprobs": args.top_logprobs, "pass_s": []}

    def one_pass() -> dict[str, list[dict]]:
        t = time.monotonic()
        sets = request_sets(srv, args, batch)
        result["pass_s"].append(round(time.monotonic() - t, 1))
        return sets

    if warmup:
        result["warmup"] = one_pass()
    result["sets"] = sets = one_pass()
    if repeat == "none":
        return result
    if repeat == "sets":
        result["repeats"] = one_pass()
        again = result["repeats"]["sequential"]
    else:
        # The noise floor: the same requests again on the same server and kernels. Any difference here is
        # not the kernels' doing.
        again = [client.generate(srv.url, [ids], max_new_tokens=args.max_new_tokens, top_logprobs=args.top_logprobs,
                                 timeout=args.request_timeout)[0] for ids in batch]
    rows = [diff.compare_request(a, b) for a, b in zip(sets["sequential"], again, strict=False)]
    result["repeat"] = {"tokens_equal": sum(r["tokens_equal"] for r in rows), "requests": len(rows),
                        "max_abs_logprob_diff": max((r["max_abs_logprob_diff"] or 0.0) for r in rows)}
    return result


def bench_phase(srv: server.Server, args: argparse.Namespace) -> dict:
    """Decode speed at each (batch, context): B concurrent streams of C-token prompts, ignore_eos."""
    vocab = vocab_size(args.model)
    rows = []
    for context in args.bench_contexts:
        # First use of a context length JITs kernels for its shapes: keep that out of the figures.
        warm = client.prompts(args.seed + context, [context], vocab)
        client.concurrent_timelines(srv.url, warm, max_new_tokens=8, timeout=args.request_timeout)
        for batch in args.bench_batches:
            ids = client.prompts(args.seed * 7919 + context * 31 + batch, [context] * batch, vocab)
            log_from = len(srv.log_text())
            sent = time.perf_counter()
            timelines = client.concurrent_timelines(srv.url, ids, max_new_tokens=args.bench_new_tokens,
                                                    timeout=args.request_timeout)
            # The server's own decode log lines for this batch: its throughput and whether it ran in a graph.
            row = {"batch": batch, "context": context, "new_tokens": args.bench_new_tokens,
                   "server_log": server.decode_log_stats(srv.log_text()[log_from:], batch)}
            try:
                fig = client.decode_figures(timelines, sent)
            except ValueError as exc:  # e.g. the first requests finished before the last began decoding
                rows.append({**row, "error": str(exc)})
                print(f"  bench {srv.env['PDSERVE_DSA_KERNELS']}: batch {batch} context {context}: {exc}", flush=True)
                continue
            rows.append({**row, "tokens_per_s": round(fig.tokens_per_s, 1), "ms_per_step": round(fig.ms_per_step, 3),
                         "steps_in_window": round(fig.steps, 1), "window_s": round(fig.window_s, 3),
                         "ttft_s": round(fig.ttft_s, 3)})
            print(f"  bench {srv.env['PDSERVE_DSA_KERNELS']}: batch {batch} context {context}: "
                  f"{fig.tokens_per_s:.0f} tok/s, {fig.ms_per_step:.2f} ms/step", flush=True)
    return {"rows": rows, "recording": args.record_dir is not None, "graph_bs": args.graph_bs}


# The plugin's own lines (kernels/python/pdserve_kernels/sglang_plugin/status.py, its only writer): a fixed
# prefix and a JSON object, one status line per scheduler process, one per distinct fallback, and one the
# first time each op really ran pdserve's kernel.
PLUGIN_PREFIXES = {"status": "pdserve-kernels status: ", "fallback": "pdserve-kernels fallback: ",
                   "ran": "pdserve-kernels ran: "}


def plugin_report(lines: list[str]) -> dict[str, list]:
    found: dict[str, list] = {kind: [] for kind in PLUGIN_PREFIXES}
    for line in lines:
        for kind, prefix in PLUGIN_PREFIXES.items():
            if prefix in line:
                text = line.split(prefix, 1)[1].strip()
                try:
                    found[kind].append(json.loads(text))
                except json.JSONDecodeError:
                    found[kind].append({"unparsed": text})
    return found


def log_findings(srv: server.Server, arch: str = "dsa") -> dict:
    """What the server's own log says about the weights, the prefix cache and the plugin."""
    text = srv.log_text()
    lines = text.splitlines()
    weight_lines = server.WEIGHT_PROBLEM_LINES[arch]
    return {
        "unknown_weights": [line for line in lines if any(w in line for w in weight_lines)][:20],
        "tree_cache_impl": server.tree_cache_impl(text),
        "plugin": plugin_report(lines),
        "plugin_lines": [line for line in lines if "pdserve" in line.lower()][:40],
    }


def plugin_summary(plugin: dict[str, list]) -> str:
    kernels = [s.get("kernels") for s in plugin["status"]]
    ran = sorted({r.get("op", "?") for r in plugin["ran"]})
    return (f"plugin status lines {len(plugin['status'])} (kernels {kernels[0] if kernels else '-'}); "
            f"ran pdserve's: {', '.join(ran) or 'none'}; fallbacks {len(plugin['fallback'])}")


def repeat_mode(arch: str, kernels: str) -> str:
    if arch == "v4":
        return "sets" if kernels == "sglang" else "none"
    return "sequential"


def new_record(kernels: str, srv: server.Server, args: argparse.Namespace) -> dict:
    # The arch and the model's config travel with the record: diff.py judges a V4 run offline from the files.
    record = {"kernels": kernels, "arch": args.arch, "argv": srv.argv, "env": srv.env, "versions": versions(),
              "plugin_entry_points": plugin_entry_points(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if kernels == "pdserve" and not record["plugin_entry_points"]:
        raise SystemExit(f"no {PLUGIN_GROUP} entry point is installed: a 'pdserve' run would run SGLang's "
                         "kernels; install the pdserve-kernels wheel into the same --target (run_on_device.sh)")
    record["model_config"] = model_config(args.model)
    return record


def run_one(kernels: str, srv: server.Server, args: argparse.Namespace) -> dict:
    """Start one server, serve the phases, stop it, summarize its records."""
    record = new_record(kernels, srv, args)
    print(f"[{kernels}] starting: {' '.join(srv.argv)}", flush=True)
    srv.start()
    try:
        record["ready_after_s"] = round(srv.wait_ready(args.ready_timeout), 1)
        print(f"[{kernels}] ready after {record['ready_after_s']} s", flush=True)
        serve(kernels, srv, args, record)
    finally:
        srv.stop()
    summarize_records(kernels, args, record)
    return record


def run_side_by_side(servers: dict[str, server.Server], args: argparse.Namespace) -> dict[str, dict]:
    """Both servers up at once on the one GPU (server.start_side_by_side: the second starts once the first has
    its KV pool), then each serves its phases in turn while the other idles; both stopped, then the records."""
    records = {kernels: new_record(kernels, srv, args) for kernels, srv in servers.items()}
    for kernels, srv in servers.items():
        print(f"[{kernels}] starting: {' '.join(srv.argv)}", flush=True)
    try:
        ready = server.start_side_by_side(list(servers.values()), args.ready_timeout)
        for kernels, seconds in zip(servers, ready, strict=True):
            records[kernels]["ready_after_s"] = round(seconds, 1)
            print(f"[{kernels}] ready after {records[kernels]['ready_after_s']} s (side by side)", flush=True)
        for kernels, srv in servers.items():
            serve(kernels, srv, args, records[kernels])
    finally:
        for srv in servers.values():
            srv.stop()
    for kernels in servers:
        summarize_records(kernels, args, records[kernels])
    return records


def serve(kernels: str, srv: server.Server, args: argparse.Namespace, record: dict) -> None:
    """The phases on a ready server; the results go into `record` and the out directory."""
    record.update(log_findings(srv, args.arch))
    if record["unknown_weights"]:
        raise SystemExit(f"[{kernels}] SGLang ignored checkpoint tensors or left parameters unloaded: "
                         f"{record['unknown_weights'][:3]}")
    if args.phase in ("compare", "all"):
        t = time.monotonic()
        record["compare"] = compare_phase(srv, args, repeat=repeat_mode(args.arch, kernels),
                                          warmup=args.arch == "v4" and not args.no_warmup)
        record["compare_s"] = round(time.monotonic() - t, 1)
        _write(args.out / f"compare-{kernels}.json", record)
        rep = record["compare"].get("repeat")
        again = (f"; the sequential requests again on the same server: {rep['tokens_equal']}/{rep['requests']} "
                 f"with equal tokens, largest |dlogprob| {rep['max_abs_logprob_diff']:.3g}") if rep else ""
        passes = ", ".join(f"{s} s" for s in record["compare"]["pass_s"])
        warm = " (the first a warm-up)" if "warmup" in record["compare"] else ""
        print(f"[{kernels}] compare phase: {record['compare_s']} s; passes {passes}{warm}{again}", flush=True)
    if args.phase in ("bench", "all"):
        t = time.monotonic()
        record["bench"] = bench_phase(srv, args)
        record["bench_s"] = round(time.monotonic() - t, 1)
        _write(args.out / f"bench-{kernels}.json", {k: v for k, v in record.items() if k != "compare"})
    record.update(log_findings(srv, args.arch))  # the plugin logs "ran" on first use, after ready
    print(f"[{kernels}] {plugin_summary(record['plugin'])}", flush=True)
    if "compare" in record:  # again, with those lines
        _write(args.out / f"compare-{kernels}.json", record)


def summarize_records(kernels: str, args: argparse.Namespace, record: dict) -> None:
    """The plugin's per-call records folded per op and layer, once the server is stopped (its files complete)."""
    if args.record_dir is None:
        return
    record["records"] = diff.summarize_records(args.record_dir / kernels)
    _write(args.out / f"records-summary-{kernels}.json", {"kernels": kernels, "rows": record["records"]})
    print(diff.records_table(record["records"]) if record["records"] else
          f"[{kernels}] no plugin records (SGLang's own kernels run without the plugin's hooks)", flush=True)


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    servers = make_servers(args)
    if args.dry_run:
        for kernels, srv in servers.items():
            env = " ".join(f"{k}={v}" for k, v in srv.env.items())
            print(f"{kernels}: {env} {' '.join(srv.argv)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    # `timeout` (run_on_device.sh) sends SIGTERM: exit through the `finally` that stops the server's
    # process group, which would otherwise outlive this script (it runs in its own session).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    records = {}
    failures: list[str] = []
    notes: list[str] = []
    gate = None
    if args.arch == "v4" and "sglang" not in servers:
        print("note: no repeatability gate and no plugin-off comparison in this call (SGLang's own server is not "
              "run); `diff.py OUT1 OUT2` judges it with a plugin-off call's files", flush=True)
    together = run_side_by_side(servers, args) if args.side_by_side else {}
    for kernels, srv in servers.items():
        records[kernels] = together[kernels] if args.side_by_side else run_one(kernels, srv, args)
        if args.arch == "v4" and kernels == "sglang":
            gate = diff.gate_from_passes(records[kernels]["compare"])
            gate["floor"] = verdict.noise_floors(gate)
            _write(args.out / "gate.json", gate)
            print(diff.gate_table(gate), flush=True)
            if args.strict_gate and verdict.gate_failures(gate) and len(servers) > 1 and not args.side_by_side:
                print("STOP: SGLang's own server did not repeat itself on the same inputs and --strict-gate asks it "
                      "to; pdserve's server was not started", flush=True)
                break
            if verdict.gate_failures(gate):  # said now too: the call may run out of time in pdserve's server
                floors = ", ".join(f"{name} {value:.3g}" for name, value in gate["floor"].items())
                print(f"[sglang] did not repeat itself; noise floor per set: {floors}; going on "
                      "(--strict-gate would stop here)", flush=True)
        if args.arch != "v4":
            failures += verdict.plugin_failures(kernels, records[kernels]["plugin"])
            if kernels == "pdserve" and "records" in records[kernels]:  # SGLang's own run records nothing
                failures += verdict.record_failures(records[kernels]["records"])
    if args.phase in ("bench", "all"):
        print(diff.bench_table({k: r["bench"] for k, r in records.items()}))
    result = None
    if args.phase in ("compare", "all") and len(records) == 2:
        result = diff.compare_runs(records["sglang"], records["pdserve"])
        _write(args.out / "diff.json", result)
        print(diff.compare_table(result))
        if args.arch != "v4":
            failures += verdict.diff_failures(result)
    if args.arch == "v4":
        on = records.get("pdserve")
        failures, notes = verdict.v4_verdict(records, gate, on.get("records") if on else None, result,
                                             model_config(args.model), strict_gate=args.strict_gate)
    for note in notes:
        print(f"NOTE: {note}", flush=True)
    for failure in failures:
        print(f"FAIL: {failure}", flush=True)
    print("PASS" if not failures else f"{len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
