"""One layout's sweep, point by point: the servers' metrics scraped around the client's run, its result
read, progress said as it goes. An interrupt ends the sweep and keeps the points already measured."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench import client, client_argv, kv_transfer
from pdserve.bench.figures import PointResult, failed, read_record
from pdserve.bench.sweep import Sweep
from pdserve.bench.workload import Point, Workload


@dataclass(frozen=True)
class Target:
    """Where the load goes and what to tell the client: the public URL, the served model's name, the
    tokenizer's directory, the key; the prefill servers whose metrics hold the KV hand-off (none: single)."""

    url: str
    model: str
    tokenizer_dir: str
    api_key: str | None
    prefill_urls: tuple[str, ...] = ()


def measure_point(python: str, workload: Workload, point: Point, target: Target, workdir: Path,
                  limit_s: float, goodput: bool = True) -> PointResult:
    before = kv_transfer.scrape(target.prefill_urls) if target.prefill_urls else []
    result_file, log_file = workdir / "result.jsonl", workdir / "client.log"
    argv = client_argv.argv(python, workload, point, target.url, target.model, target.tokenizer_dir, str(result_file),
                            goodput)
    # One bound for every point, the user's (--point-timeout): a point's length cannot be told in advance,
    # as a rate above the server's capacity makes it the server's throughput, not the rate, that sets it.
    run = client.run(argv, client_argv.default_environment(target.api_key), result_file, log_file, limit_s)
    if run.problem and not run.result:
        return failed(point, run.problem)
    kv = kv_transfer.mean_ms(before, kv_transfer.scrape(target.prefill_urls)) if target.prefill_urls else None
    result = read_record(point, run.result, kv, goodput)
    if run.problem and result.measured:  # figures written, then the client failed: keep them, say so
        return PointResult(result.point, result.figures, result.completed, result.duration_s,
                           result.total_output_tokens, {**result.errors, run.problem: 1})
    return result


def sweep(layout: str, python: str, workload: Workload, target: Target, limit_s: float,
          say: Callable[[str], None], points: Sequence[Point] | None = None) -> Sweep:
    done = Sweep(layout, target.url)
    points = list(points if points is not None else workload.points())
    env = client_argv.default_environment(target.api_key)
    goodput = client.accepts_option(python, client_argv.MODULE, "--goodput", env) is not False
    if not goodput:
        say("the benchmark client has no --goodput (SGLang before 0.5.23): goodput is not measured")
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-") as scratch:
        for index, point in enumerate(points, 1):
            say(f"[{layout} {index}/{len(points)}] {workload.name}: {point.label}, {point.prompts} prompts of "
                f"{workload.input_len}+{workload.output_len} tokens")
            try:
                result = measure_point(python, workload, point, target, Path(scratch), limit_s, goodput)
            except KeyboardInterrupt:
                done.interrupted = True
                say(f"[{layout} {index}/{len(points)}] interrupted: keeping the {index - 1} point(s) measured")
                break
            done.results.append(result)
            say(f"[{layout} {index}/{len(points)}] " + (f"no figures: {result.failure}" if result.failure else
                f"{result.completed}/{point.prompts} done, {result.figures['output_tok_s']:.1f} output tok/s"))
    return done
