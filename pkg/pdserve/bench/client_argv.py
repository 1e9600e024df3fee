"""The command line and environment of SGLang's benchmark client for one sweep point. Pure.

Why sglang.bench_serving: it is the client SGLang's own PD and performance reports use, it ships with the
SGLang the deployment runs (so the client is pinned with the server, nothing else to install on the host),
it sends random-token prompts drawn from the model's tokenizer without fetching anything
(`--dataset-name random-ids`), it measures TTFT, ITL, TPOT and end-to-end latency per request on a
streaming OpenAI chat endpoint (the one the router serves), and it counts goodput against SLOs itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pdserve.bench.workload import Point, Workload

MODULE = "sglang.benchmark.serving"  # SGLang 0.5.23's path (sglang.bench_serving forwards to it, with a warning)
BACKEND = "sglang-oai-chat"  # streaming /v1/chat/completions: what the router serves in both layouts
DATASET = "random-ids"  # "random" would download ShareGPT for its text; random-ids draws token ids
# The Hub's libraries must not reach the network: the tokenizer is the model directory's own.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def exact(value: float) -> str:
    """A float as the client's float() reads back bit for bit: repr is Python's shortest round-trip form
    (`:g` keeps six digits, so an SLO of 1234567.5 ms would become 1234570)."""
    return repr(float(value))


def argv(python: str, workload: Workload, point: Point, base_url: str, model: str, tokenizer_dir: str,
         output_file: str, goodput: bool = True) -> list[str]:
    """`python -m sglang.benchmark.serving ...` for one point. No secret on it: argv is world-readable in
    /proc, so the API key travels in the environment (environment()). Every value is joined to its option
    (`--model=NAME`): argparse would take a value that starts with `-` for an option. `goodput`: False for a
    client without --goodput (SGLang before 0.5.23), which then measures no goodput."""
    load = ([f"--request-rate={exact(point.value)}"] if point.kind == "rate"
            else ["--request-rate=inf", f"--max-concurrency={int(point.value)}"])
    slos = [f"{key}:{exact(value)}" for key, value in workload.slos_ms().items()]
    return [
        python, "-m", MODULE,
        f"--backend={BACKEND}", f"--base-url={base_url}", f"--model={model}", f"--tokenizer={tokenizer_dir}",
        f"--dataset-name={DATASET}", f"--random-input-len={workload.input_len}",
        f"--random-output-len={workload.output_len}", f"--random-range-ratio={exact(workload.range_ratio)}",
        f"--num-prompts={point.prompts}", f"--seed={workload.seed}", *load,
        *(["--goodput", *slos] if goodput else []),
        # pdserve waited for the router's /readiness already; the client's own wait asks /v1/models
        # without the key, which a keyed router refuses.
        "--ready-check-timeout-sec=0",
        f"--output-file={output_file}", "--output-details",
    ]


def environment(base: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """The client's environment: ours, offline, with the key where bench_serving reads it (OPENAI_API_KEY,
    sent as `Authorization: Bearer`), and without a key of ours when the deployment has none."""
    env = {k: v for k, v in base.items() if k not in ("OPENAI_API_KEY", "API_KEY")}
    env.update(OFFLINE)
    env["PYTHONUNBUFFERED"] = "1"
    if api_key is not None:
        env["OPENAI_API_KEY"] = api_key
    return env


def default_environment(api_key: str | None) -> dict[str, str]:
    return environment(os.environ, api_key)
