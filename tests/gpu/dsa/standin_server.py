"""A CPU stand-in for `python -m sglang.launch_server` with just what compare.py uses, for testing the
driver end to end without a GPU: the ready log line, /model_info, and /generate (one or many
input_ids; greedy logprobs in SGLang's [logprob, token_id, text] triples; SSE streaming with
meta_info.completion_tokens). Tokens are a function of the prompt; with PDSERVE_DSA_KERNELS=pdserve
the logprobs move by 1e-4 and the last prompt's tokens diverge at position 2, so a comparison has
something to find. For a DeepSeek-V4 config (model_type deepseek_v4) its status line names the V4
backend, its records are V4's (every layer's attention, the C4 layers' top-k) and it logs the prefix cache
it would have built. Servers that do not repeat themselves: STANDIN_NOT_REPEATABLE=1 moves the logprobs by 1e-6
from one prompt served to the next; STANDIN_NOT_REPEATABLE=first-token moves the first position's top-2
logprobs by up to 0.1 per step of (prompts served mod 3) and lets the runner-up win there, as SGLang's V4 server did
on the GPU (tokens differ from token 0); STANDIN_SETTLE_AFTER=N makes only the first N prompts served differ
(a server that repeats itself once warm). STANDIN_PDSERVE_SHIFT moves pdserve's logprobs (default 1e-4).
Before the ready line it logs SGLang's "Memory pool end" line (STANDIN_POOL_AFTER_S and STANDIN_READY_AFTER_S delay
it and the ready line: a second server started beside it waits for that line). /start_profile takes SGLang's
ProfileReq; by stage with num_steps it writes a decode trace in the torch profiler's chrome format after that many
streamed steps (steps.py reads it).
Not SGLang: nothing here says anything about SGLang's numbers.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY = "The server is fired up and ready to roll!"


def launch_env(directory) -> dict[str, str]:
    """The environment (PYTHONPATH) under which `python -m sglang.launch_server` is this stand-in, with a
    dist-info carrying a `sglang.srt.plugins` entry point (what the pdserve-kernels wheel provides), both
    made in `directory`: for the CPU tests of compare.py."""
    from pathlib import Path

    fake = Path(directory) / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(
        f"import runpy\nrunpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n")
    info = fake / "pdserve_standin_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pdserve-standin-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nstandin = os:getcwd\n")
    root = Path(__file__).resolve().parents[3]
    return {**os.environ, "PYTHONPATH": f"{fake}:{root}"}
STEP_S = 0.002
LAYERS_IN_TRACE = 4  # layers per step in the decode trace /start_profile writes


_CALLS = itertools.count()


def tokens_for(ids: list[int], n: int, vocab: int, kernels: str) -> list[tuple[int, float, list]]:
    base = sum(ids)
    served = next(_CALLS)
    mode = os.environ.get("STANDIN_NOT_REPEATABLE", "")
    drift = 1e-6 * served if mode == "1" else 0.0
    settle = os.environ.get("STANDIN_SETTLE_AFTER")
    if settle is not None and served < int(settle):
        drift = 0.01  # not warm yet
    step = served % 3
    shift = float(os.environ.get("STANDIN_PDSERVE_SHIFT", "1e-4")) if kernels == "pdserve" else 0.0
    out = []
    for i in range(n):
        tok = 5 + (base + 31 * i) % (vocab - 5)
        if kernels == "pdserve" and len(ids) % 2 == 1 and i >= 2:  # odd-length prompts diverge at 2
            tok = 5 + (tok + 1 - 5) % (vocab - 5)
        alt = 5 + (tok + 1 - 5) % (vocab - 5)
        lp = -0.05 - 0.1 * (i % 5) + shift - drift
        top = [[lp, tok, None], [lp - 1.0, alt, None]]
        if i == 0 and mode == "first-token":  # a runner-up 0.1 behind at step 0 wins from step 1 on
            first, second = lp - 0.1 * step, lp - 0.1 + 0.05 * step
            top = sorted([[first, tok, None], [second, alt, None]], reverse=True)
            lp, tok = top[0][0], top[0][1]
        out.append((tok, lp, top))
    return out


def result(ids: list[int], params: dict, vocab: int, kernels: str) -> dict:
    gen = tokens_for(ids, int(params.get("max_new_tokens", 16)), vocab, kernels)
    return {"text": "", "output_ids": [t for t, _, _ in gen],
            "meta_info": {"prompt_tokens": len(ids), "completion_tokens": len(gen), "e2e_latency": 0.01,
                          "output_token_logprobs": [[lp, t, None] for t, lp, _ in gen],
                          "output_top_logprobs": [top for _, _, top in gen]}}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--disable-radix-cache", action="store_true")
    args, _ = p.parse_known_args()
    with open(os.path.join(args.model_path, "config.json")) as config:
        model_config = json.load(config)
    vocab = model_config["vocab_size"]
    v4 = model_config.get("model_type") == "deepseek_v4"
    kernels = os.environ.get("PDSERVE_DSA_KERNELS", "sglang")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a) -> None:
            pass

        def _json(self, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/model_info":
                self._json({"model_path": args.model_path})
            else:
                self.send_error(404)

        def _text(self, text: str) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/start_profile":  # SGLang's ProfileReq, by stage: the next stream's decode steps
                profile.update(req, steps_seen=0)
                self._text("Start profiling.\n")
                return
            ids, params = req["input_ids"], req.get("sampling_params", {})
            if not req.get("stream"):
                batch = ids if ids and isinstance(ids[0], list) else None
                outs = [result(x, params, vocab, kernels) for x in (batch or [ids])]
                self._json(outs if batch is not None else outs[0])
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(STEP_S * 5)  # "prefill"
            for n in range(1, int(params.get("max_new_tokens", 16)) + 1):
                chunk = {"text": "", "meta_info": {"completion_tokens": n}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(STEP_S)
                profiled_step()
            self.wfile.write(b"data: [DONE]\n\n")

    profile: dict = {}
    lock = threading.Lock()

    def profiled_step() -> None:
        """Count a decode step of a profile started by stage; after num_steps write the decode trace where SGLang's
        profiler manager would ({output_dir}/{profile_id}-TP-0-DECODE.trace.json.gz), in the torch profiler's
        chrome format: per step one cudaGraphLaunch and, per layer, an attention kernel named as this server's
        kernel choice would launch it (FlashMLA's, or pdserve's sparse_mla_*) beside a GEMM."""
        with lock:
            if not profile.get("profile_by_stage") or profile["steps_seen"] >= profile["num_steps"]:
                return
            profile["steps_seen"] += 1
            if profile["steps_seen"] < profile["num_steps"]:
                return
            attention = "sparse_mla_decode_v4_h64" if kernels == "pdserve" else "void flash_fwd_splitkv_mla_kernel<>"
            events = []
            for step in range(profile["num_steps"]):
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": step * 100,
                               "dur": 5})
                for layer in range(LAYERS_IN_TRACE):
                    events += [{"ph": "X", "cat": "kernel", "name": attention, "ts": step * 100 + layer, "dur": 20},
                               {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": step * 100 + layer, "dur": 60}]
            name = f"{profile['profile_id']}-TP-0-DECODE.trace.json.gz"
            os.makedirs(profile["output_dir"], exist_ok=True)
            with gzip.open(os.path.join(profile["output_dir"], name), "wt") as f:
                json.dump({"traceEvents": events}, f)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    # Lines in the shape of the plugin's (kernels/python/pdserve_kernels/sglang_plugin/status.py).
    ops = {"indexer_topk": kernels, "sparse_mla_decode": kernels}
    status = {"requested": kernels, "kernels": ops, **({"model": "deepseek_v4"} if v4 else {})}
    print(f"[stand-in] pdserve-kernels status: {json.dumps(status)}", flush=True)
    cache = "SWAChunkCache" if args.disable_radix_cache else "UnifiedRadixCache"
    print(f"[stand-in] Tree cache initialized: source=default impl={cache} hybrid_swa={v4}", flush=True)
    if kernels == "pdserve":
        print('[stand-in] pdserve-kernels ran: {"op": "indexer_topk", "shape": "B=1"}', flush=True)
        print('[stand-in] pdserve-kernels ran: {"op": "sparse_mla_decode", "shape": "B=1"}', flush=True)
    record_dir = os.environ.get("PDSERVE_DSA_RECORD_DIR")
    if record_dir and v4 and kernels == "pdserve":  # V4: each layer's attention, each C4 layer's top-k
        os.makedirs(record_dir, exist_ok=True)
        with open(os.path.join(record_dir, f"records-{os.getpid()}.jsonl"), "w") as f:
            for layer, ratio in enumerate(model_config["compress_ratios"]):
                if ratio == 4:
                    f.write(json.dumps({"op": "indexer_topk", "layer": layer, "rows": 2, "lengths": [650, 1750],
                                        "selected_ours": [512, 512], "selected_sglang": [512, 512],
                                        "overlap_min": 1.0, "overlap_mean": 1.0, "rows_identical_sets": 2,
                                        "call": 0}) + "\n")
                f.write(json.dumps({"op": "sparse_mla_decode", "variant": "v4", "layer": layer, "rows": 2,
                                    "rel_l2": 5e-5 if ratio == 0 else 1e-3, "rel_l2_worst_row": 2e-3,
                                    "max_abs": 0.01, "nonfinite": 0, "call": 0, "exact_rows": 2,
                                    "rel_l2_ours_vs_fp32": 1.1e-3, "rel_l2_sglang_vs_fp32": 1.2e-3}) + "\n")
    elif record_dir and not v4:  # two records of the plugin's shadow comparison, in its format
        os.makedirs(record_dir, exist_ok=True)
        with open(os.path.join(record_dir, f"records-{os.getpid()}.jsonl"), "w") as f:
            f.write(json.dumps({"op": "indexer_topk", "layer": 0, "rows": 2, "lengths": [2100, 2201],
                                "selected_ours": [2048, 2048], "selected_sglang": [2048, 2048], "overlap_min": 0.999,
                                "overlap_mean": 0.9995, "rows_identical_sets": 1, "call": 0}) + "\n")
            f.write(json.dumps({"op": "sparse_mla_decode", "variant": "fp8", "layer": 0, "rows": 2, "rel_l2": 0.004,
                                "rel_l2_worst_row": 0.006, "max_abs": 0.01, "nonfinite": 0, "call": 0,
                                "exact_rows": 2, "rel_l2_ours_vs_fp32": 0.0017,
                                "rel_l2_sglang_vs_fp32": 0.0055}) + "\n")
    print(f"stand-in server: kernels={kernels}", flush=True)
    # A server started beside this one waits for this line (tests/gpu/dsa/server.py start_side_by_side).
    time.sleep(float(os.environ.get("STANDIN_POOL_AFTER_S", "0")))
    print("[stand-in] Memory pool end. avail mem=1.00 GB", flush=True)
    time.sleep(float(os.environ.get("STANDIN_READY_AFTER_S", "0")))
    print(READY, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
