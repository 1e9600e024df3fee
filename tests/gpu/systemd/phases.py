"""Where a worker's start goes, read from its journal: pure functions of (monotonic µs, message) entries."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# SGLang 0.5.17's own log lines (sglang/srt/distributed/bootstrap.py, model_runner.py,
# model_runner_components/cuda_graph_setup.py, entrypoints/http_server.py).
MARKERS = (
    ("distributed_init", re.compile(r"Init torch distributed begin")),
    ("weights_begin", re.compile(r"Load weight begin")),
    ("weights_end", re.compile(r"Load weight end")),
    ("graphs_begin", re.compile(r"Capture .* begin\.")),
    ("graphs_end", re.compile(r"Capture .* end\.")),
    ("fired_up", re.compile(r"The server is fired up and ready to roll")),
)


@dataclass(frozen=True)
class Entry:
    monotonic_us: int
    message: str


def parse_journal_json(text: str) -> list[Entry]:
    """`journalctl -o json` lines into entries (MESSAGE may be a byte array when it is not UTF-8)."""
    entries = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        message = record.get("MESSAGE", "")
        if isinstance(message, list):
            message = bytes(message).decode("utf-8", "replace")
        if "__MONOTONIC_TIMESTAMP" in record:
            entries.append(Entry(int(record["__MONOTONIC_TIMESTAMP"]), str(message)))
    return entries


def phases(entries: list[Entry], started_us: int, ready_us: int | None) -> dict[str, float | None]:
    """Seconds from the process start (ExecMainStartTimestamp) to each marker's first line after it, the last
    graph capture's end rather than the first, and to the gate passing (ActiveEnterTimestamp)."""
    after = [e for e in entries if e.monotonic_us >= started_us]
    found: dict[str, float | None] = {}
    for name, pattern in MARKERS:
        hits = [e.monotonic_us for e in after if pattern.search(e.message)]
        if name == "graphs_end":
            hits = hits[-1:]
        found[f"{name}_s"] = round((hits[0] - started_us) / 1e6, 2) if hits else None
    found["gate_passed_s"] = None if ready_us is None else round((ready_us - started_us) / 1e6, 2)
    return found


def spans(marks: dict[str, float | None]) -> dict[str, float | None]:
    """The phases as durations: start to distributed init, weights, graph capture, to fired up, to the gate."""
    def between(a: str, b: str) -> float | None:
        x, y = marks.get(a), marks.get(b)
        return None if x is None or y is None else round(y - x, 2)

    return {
        "process_start_to_distributed_init_s": marks.get("distributed_init_s"),
        "distributed_init_to_weights_s": between("distributed_init_s", "weights_begin_s"),
        "weights_s": between("weights_begin_s", "weights_end_s"),
        "weights_to_graphs_s": between("weights_end_s", "graphs_begin_s"),
        "graph_capture_s": between("graphs_begin_s", "graphs_end_s"),
        "graphs_to_fired_up_s": between("graphs_end_s", "fired_up_s"),
        "fired_up_to_gate_s": between("fired_up_s", "gate_passed_s"),
        "process_start_to_gate_s": marks.get("gate_passed_s"),
    }
