"""One real SGLang 0.5.17 server of a tiny DeepSeek model on one H200: its command line, its environment,
and starting, gating and stopping it with deadlines. Two architectures (`arch`):

* "dsa": the tiny DeepSeek-V3.2 on the FP8 DSA path, the flags that served in its probe
  (facts/sglang-dsa.md §4);
* "v4": the tiny DeepSeek-V4 on SGLang's dsv4 backend, the command that served in its probe
  (facts/sglang-dsv4.md §4), with the prefix cache off (below).

Both load the real weights (`--load-format auto` on the written model.safetensors) instead of dummy ones.
Which kernels run is chosen by PDSERVE_DSA_KERNELS, read by pdserve's SGLang plugin in every scheduler
process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KERNELS = ("sglang", "pdserve")
ARCHS = ("dsa", "v4")
READY_LINE = "The server is fired up and ready to roll"
POOL_LINE = "Memory pool end"  # logged once the KV pool is allocated (0.5.17's kv_cache_configurator)
# A checkpoint name the model does not have is only warned about by SGLang's DeepSeek loaders; V4's also
# warns about parameters no checkpoint tensor filled (they keep torch.empty's garbage).
UNKNOWN_WEIGHT_LINE = "not found in params_dict"
UNINITIALIZED_LINE = "Some weights are not initialized from checkpoints"
WEIGHT_PROBLEM_LINES = {"dsa": (UNKNOWN_WEIGHT_LINE,), "v4": (UNKNOWN_WEIGHT_LINE, UNINITIALIZED_LINE)}
CONTEXT_LENGTH = 16384
V4_CONTEXT_LENGTH = 8192  # the V4 probe's
CONTEXT_LENGTHS = {"dsa": CONTEXT_LENGTH, "v4": V4_CONTEXT_LENGTH}
DEFAULT_GRAPH_BS = (1, 2, 4, 8, 16)
STOP_TIMEOUT = 20.0
# SGLang logs which prefix cache it built: "Tree cache initialized: source=default impl=SWAChunkCache ...".
_TREE_CACHE_LINE = re.compile(r"Tree cache initialized: .*?impl=(\w+)")

# The H200 FP8 DSA path of the probe: FlashMLA's sparse FP8 decode, DeepGEMM's paged MQA logits and
# the v2 JIT top-k; radix cache off so every request prefills in full and the two runs see the same
# batches; torch sampling (no FlashInfer sampling JIT); prefill CUDA graphs off (decode is compared).
DSA_FLAGS = [
    "--attention-backend", "dsa", "--kv-cache-dtype", "fp8_e4m3",
    "--dsa-prefill-backend", "flashmla_kv", "--dsa-decode-backend", "flashmla_kv",
    "--page-size", "64", "--sampling-backend", "pytorch", "--cuda-graph-backend-prefill", "disabled",
]
# By default short prefills take a dense path (FA3, whose library is not carried); 0 sends every
# prefill through the sparse path.
DSA_ENV = {"SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"}

# V4 (facts/sglang-dsv4.md §4): SGLang picks the dsv4 backend, 256-token pages and the fp8_e4m3 cache itself.
# Torch sampling, no prefill graphs, 4096-token prefill chunks: as in the probe. The radix cache is off: with
# it the probe's same greedy prompt, served twice, diverged at the 4th token (a cached prefix takes another
# path), so two runs could not be compared; without it every request prefills in full (SGLang builds its
# SWA chunk cache instead, and logs which: tree_cache_impl).
V4_FLAGS = ["--chunked-prefill-size", "4096", "--sampling-backend", "pytorch",
            "--cuda-graph-backend-prefill", "disabled"]
NO_RADIX_CACHE = ["--disable-radix-cache"]
# bf16 weights: wo_a is not FP8 (the loader raises otherwise) and the experts are not FP4; the mHC kernels
# compile on first use instead of for every prefill bucket at load (minutes of TileLang/DeepGEMM JIT).
V4_ENV = {"SGLANG_OPT_FP8_WO_A_GEMM": "0", "SGLANG_DSV4_FP4_EXPERTS": "0", "SGLANG_DSV4_MHC_PREWARM": "0"}
ARCH_ENV = {"dsa": DSA_ENV, "v4": V4_ENV}


def server_args(model: Path, port: int, *, graph_bs: tuple[int, ...] = DEFAULT_GRAPH_BS,
                max_running: int = 32, mem_fraction: float = 0.25, extra: list[str] | None = None,
                arch: str = "dsa", radix_cache: bool = False, context_length: int | None = None) -> list[str]:
    """The arguments after `python -m sglang.launch_server`. `radix_cache` keeps SGLang's prefix cache on: for the
    decode-step measurement (steps.py), where a repeated prompt should not prefill again, and for a V4 machine where
    --disable-radix-cache would not start (not seen). Comparisons of logprobs keep it off (see V4_FLAGS)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, not {arch!r}")
    flags = (DSA_FLAGS if arch == "dsa" else V4_FLAGS) + ([] if radix_cache else NO_RADIX_CACHE)
    args = [
        "--model-path", str(model), "--load-format", "auto", "--trust-remote-code", "--tp-size", "1",
        "--host", "127.0.0.1", "--port", str(port), "--context-length", str(context_length or CONTEXT_LENGTHS[arch]),
        "--mem-fraction-static", str(mem_fraction), "--max-running-requests", str(max_running),
        *flags, "--log-level", "info",
    ]
    if graph_bs:
        args += ["--cuda-graph-bs-decode", *map(str, graph_bs)]
    else:
        args += ["--cuda-graph-backend-decode", "disabled"]  # all decode eager
    return args + list(extra or [])


def server_env(kernels: str, record_dir: Path | None, arch: str = "dsa") -> dict[str, str]:
    """What the server adds to the environment: the architecture's switches, the plugin's kernel choice and,
    for an eager recording run, where the plugin dumps its per-layer intermediates."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, not {arch!r}")
    env = {**ARCH_ENV[arch], "PDSERVE_DSA_KERNELS": kernels, "PYTHONUNBUFFERED": "1"}
    if record_dir is not None:
        env["PDSERVE_DSA_RECORD_DIR"] = str(record_dir)
    return env


class ServerFailed(RuntimeError):
    pass


@dataclass
class Server:
    argv: list[str]
    env: dict[str, str]
    log: Path
    port: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ready_after: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # A fresh log: its findings (ready, plugin status, "ran" lines) must be this start's alone.
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env}, start_new_session=True)
        self.started = time.monotonic()

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float) -> float:
        """Until the server logs its ready line and answers /model_info; fails at once if it exits."""
        self.wait_for(lambda: READY_LINE in self.log_text() and _answers(self.url + "/model_info"), timeout, "ready")
        self.ready_after = time.monotonic() - self.started
        return self.ready_after

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `condition()` holds, polled once a second; fails at once if the server exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ServerFailed(f"server exited with {code} before it was {what}; log: {self.log}\n"
                                   + tail(self.log_text(), 30))
            if condition():
                return
            time.sleep(1.0)
        raise ServerFailed(f"server not {what} after {timeout:.0f} s; log: {self.log}\n" + tail(self.log_text(), 30))

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to the server's process group, then SIGKILL to what is left of it (as pd_run.py does):
        scheduler and detokenizer children share the group and must not keep holding the GPU."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout)


def start_side_by_side(servers: list[Server], timeout: float) -> list[float]:
    """Start `servers` on one GPU, each once the one before has allocated its KV pool, then wait until all are ready;
    each one's seconds from its own start to ready. Why staggered: SGLang 0.5.17 budgets its pool as the memory free
    at its start times --mem-fraction-static, less its weights (kv_cache_configurator, pre_model_load_memory), so a
    server that started before the other's pool existed would count that memory as its own and the later of the
    two would find none. Why side by side: a V4 server takes minutes to start, mostly one-time work that the second
    does while the first does its own. Every server started is left to the caller to stop, also on a failure."""
    deadline = time.monotonic() + timeout
    for before, srv in zip([None, *servers], servers, strict=False):
        if before is not None:
            before.wait_for(lambda b=before: POOL_LINE in b.log_text() or READY_LINE in b.log_text(),
                            deadline - time.monotonic(), "done allocating its KV pool")
        srv.start()
    return [srv.wait_ready(max(deadline - time.monotonic(), 1.0)) for srv in servers]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _answers(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


# SGLang's scheduler logs every decode_log_interval (40) decode steps, e.g.
# "Decode batch, #running-req: 4, #token: 16640, token usage: 0.00, cuda graph: True, gen throughput (token/s): 1234.56,
#  #queue-req: 0" (one line)
_DECODE_LINE = re.compile(r"Decode batch\b.*?#running-req: (\d+),.*?([A-Za-z][\w ]*): (True|False), "
                          r"gen throughput \(token/s\): ([\d.]+)")


def decode_log_stats(text: str, batch: int) -> dict:
    """What the server itself logged about decode batches of exactly `batch` requests in `text`: its
    throughput figures and whether those steps ran in a CUDA graph."""
    rows = [(int(m[1]), m[2].strip(), m[3] == "True", float(m[4])) for m in _DECODE_LINE.finditer(text)]
    mine = [r for r in rows if r[0] == batch]
    return {"lines": len(mine), "gen_throughput": [r[3] for r in mine],
            "graph": sorted({f"{r[1]}: {r[2]}" for r in mine})}


def tree_cache_impl(text: str) -> str | None:
    """The prefix cache class SGLang says it built (None if it did not say)."""
    found = _TREE_CACHE_LINE.findall(text)
    return found[-1] if found else None


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


# The V4 probe's sizes: 0.3 of the H200 for weights and KV, 16 running requests at most.
ARCH_SIZES = {"dsa": {"max_running": 32, "mem_fraction": 0.25}, "v4": {"max_running": 16, "mem_fraction": 0.3}}


def make_server(model: Path, port: int, kernels: str, log: Path, *, record_dir: Path | None = None,
                graph_bs: tuple[int, ...] = DEFAULT_GRAPH_BS, extra: list[str] | None = None,
                python: str = sys.executable, arch: str = "dsa", radix_cache: bool = False,
                context_length: int | None = None) -> Server:
    argv = [python, "-m", "sglang.launch_server",
            *server_args(model, port, graph_bs=graph_bs, extra=extra, arch=arch, radix_cache=radix_cache,
                         context_length=context_length,
                         **ARCH_SIZES.get(arch, {}))]
    return Server(argv=argv, env=server_env(kernels, record_dir, arch), log=log, port=port)
