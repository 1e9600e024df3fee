"""Named, reproducible workloads: what a bench run sends, checked before any request is sent.

A workload is random prompts of a given input and output length (token ids drawn from the model's own
tokenizer, so nothing is fetched), a sweep of request rates (open loop) or of concurrencies (closed loop),
a seed, how long each sweep point runs (or how many prompts it sends), and the latency SLOs its goodput is
counted against. Built-in workloads cover the common shapes; a TOML file (`[workloads.NAME]` tables) adds
or replaces them. Every check here is pure: the caller passes what it read (the file's tables, the model
directory's file names, the context length), and every refusal is a Problem naming field, value and fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pdserve.schema.problems import Problem, did_you_mean

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_PROMPTS = 100_000  # per sweep point: beyond this a run is hours long, almost surely a typo
MAX_POINTS = 32
MAX_TOKENS = 10_000_000
MAX_SEED = 2**32 - 1  # numpy's seed range (bench_serving seeds numpy with it)
# A tokenizer directory as transformers' AutoTokenizer reads it: the fast tokenizer's file, or a
# tokenizer_config.json beside the slow tokenizer's vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

Kind = Literal["rate", "concurrency"]


@dataclass(frozen=True)
class Point:
    """One sweep point: `kind` rate (requests/s, open loop) or concurrency (requests in flight)."""

    kind: Kind
    value: float
    prompts: int

    @property
    def label(self) -> str:
        return f"{self.value:g} req/s" if self.kind == "rate" else f"{int(self.value)} in flight"


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    request_rates: tuple[float, ...] = ()
    concurrencies: tuple[int, ...] = ()
    duration_s: float | None = None  # rate sweeps: each point sends ceil(rate * duration_s) prompts
    prompts: int | None = None  # per point; a concurrency sweep needs it (or it beats duration_s)
    range_ratio: float = 1.0  # lengths drawn from [len * ratio, len]; 1.0: every prompt exactly len
    seed: int = 1
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 100.0
    slo_e2e_ms: float | None = None

    def points(self) -> list[Point]:
        if self.request_rates:
            return [Point("rate", rate, self.prompts or max(1, math.ceil(rate * (self.duration_s or 0))))
                    for rate in self.request_rates]
        return [Point("concurrency", float(c), self.prompts or 0) for c in self.concurrencies]

    def slos_ms(self) -> dict[str, float]:
        """The SLOs as bench_serving's --goodput keys (ttft, tpot, e2el)."""
        slos = {"ttft": self.slo_ttft_ms, "tpot": self.slo_tpot_ms}
        if self.slo_e2e_ms is not None:
            slos["e2el"] = self.slo_e2e_ms
        return slos

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["request_rates"], data["concurrencies"] = list(self.request_rates), list(self.concurrencies)
        return data


BUILT_IN: dict[str, dict[str, Any]] = {
    # A chat service's shape: short answers to mid-length prompts, the rate raised until it saturates.
    "chat": {"input_len": 1024, "output_len": 256, "request_rates": [1, 2, 4, 8], "duration_s": 60,
             "slo_ttft_ms": 1000, "slo_tpot_ms": 50},
    # Where PD is meant to pay off: long prefills that stall a co-located decode.
    "long-prefill": {"input_len": 8192, "output_len": 256, "request_rates": [0.5, 1, 2], "duration_s": 60,
                     "slo_ttft_ms": 4000, "slo_tpot_ms": 50},
    # Closed loop: the throughput ceiling at each number of requests in flight.
    "saturate": {"input_len": 1024, "output_len": 512, "concurrencies": [1, 8, 32, 64], "prompts": 128,
                 "slo_ttft_ms": 2000, "slo_tpot_ms": 100},
    # A one-minute sanity run: does the client reach the model, and what does one user see.
    "smoke": {"input_len": 128, "output_len": 32, "request_rates": [1], "prompts": 8,
              "slo_ttft_ms": 2000, "slo_tpot_ms": 200},
}
FIELDS = ("input_len", "output_len", "request_rates", "concurrencies", "duration_s", "prompts", "range_ratio",
          "seed", "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


class _Reader:
    """Reads one workload table, collecting a Problem per bad field instead of stopping at the first."""

    def __init__(self, name: str, table: Mapping[str, Any]):
        self.name, self.table = name, table
        self.problems: list[Problem] = []

    def field(self, key: str) -> str:
        return f"workloads.{self.name}.{key}"

    def refuse(self, key: str, message: str, fix: str) -> None:
        self.problems.append(Problem(self.field(key), self.table.get(key), message, fix))

    def integer(self, key: str, low: int, high: int, default: int | None = None) -> int | None:
        value = self.table.get(key, default)
        if value is None:
            return None
        if not _is_int(value) or not low <= value <= high:
            self.refuse(key, f"must be a whole number from {low} to {high}", f"set {key} = a number in that range")
            return None
        return value

    def number(self, key: str, low: float, high: float, default: float | None = None,
               low_open: bool = True) -> float | None:
        value = self.table.get(key, default)
        if value is None:
            return None
        # The type first: a string or a table must be refused, not compared (a TypeError would escape).
        if not _is_number(value) or not (value > low if low_open else value >= low) or value > high:
            bound = f"above {low:g}" if low_open else f"at least {low:g}"
            self.refuse(key, f"must be a finite number {bound} and at most {high:g}", f"set {key} in that range")
            return None
        return float(value)


def read_workload(name: str, table: Any) -> tuple[Workload | None, list[Problem]]:
    """The workload in `table` (a file's or a built-in's), or every problem with it."""
    if not NAME.match(name):
        return None, [Problem("workloads", name, "a workload name is lowercase letters, digits and dashes",
                              "rename the table, e.g. [workloads.long-prefill]")]
    if not isinstance(table, Mapping):
        return None, [Problem(f"workloads.{name}", table, "must be a table", f"write it as [workloads.{name}]")]
    r = _Reader(name, table)
    for key in table:
        if key not in FIELDS:
            r.refuse(key, "is not a workload field",
                     f"{did_you_mean(key, FIELDS)}remove it; fields: {', '.join(FIELDS)}")
    input_len = r.integer("input_len", 1, MAX_TOKENS)
    output_len = r.integer("output_len", 1, MAX_TOKENS)
    if "input_len" not in table or "output_len" not in table:
        missing = "input_len" if "input_len" not in table else "output_len"
        r.refuse(missing, "is required and missing", f"set {missing} = the tokens per request")
    rates = _sweep(r, "request_rates", float)
    concurrencies = _sweep(r, "concurrencies", int)
    if bool(rates) == bool(concurrencies) and not r.problems:
        r.refuse("request_rates", "give exactly one sweep: request_rates (open loop) or concurrencies (closed loop)",
                 "keep one of the two")
    duration = r.number("duration_s", 0, 86_400)
    prompts = r.integer("prompts", 1, MAX_PROMPTS)
    if concurrencies and prompts is None and "prompts" not in table:
        r.refuse("prompts", "a concurrency sweep sends a fixed number of prompts per point",
                 "set prompts = the requests each point sends (e.g. 4x the largest concurrency)")
    if rates and prompts is None and duration is None and "prompts" not in table and "duration_s" not in table:
        r.refuse("duration_s", "a rate sweep needs how long each point runs (or how many prompts it sends)",
                 "set duration_s = the seconds per point (e.g. 60), or prompts")
    if rates and duration is not None and prompts is None:
        for rate in rates:
            if rate * duration > MAX_PROMPTS:
                r.refuse("duration_s", f"{rate:g} req/s for {duration:g} s is more than {MAX_PROMPTS} prompts",
                         "shorten duration_s, or set prompts")
    ratio = r.number("range_ratio", 0, 1, default=1.0)
    seed = r.integer("seed", 0, MAX_SEED, default=1)
    ttft = r.number("slo_ttft_ms", 0, 3_600_000, default=1000.0)
    tpot = r.number("slo_tpot_ms", 0, 3_600_000, default=100.0)
    e2e = r.number("slo_e2e_ms", 0, 3_600_000)
    if r.problems or input_len is None or output_len is None:
        return None, r.problems
    return Workload(name, input_len, output_len, tuple(rates), tuple(int(c) for c in concurrencies), duration,
                    prompts, ratio, seed, ttft, tpot, e2e), []  # type: ignore[arg-type]  # defaults never None


def _sweep(r: _Reader, key: str, kind: type) -> list[float]:
    values = r.table.get(key)
    if values is None:
        return []
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_POINTS:
        r.refuse(key, f"must be a list of 1 to {MAX_POINTS} values", f"write e.g. {key} = [1, 2, 4]")
        return []
    good = []
    for value in values:
        if kind is int and not (_is_int(value) and 1 <= value <= 100_000):
            r.refuse(key, f"{value!r}: a concurrency is a whole number from 1 to 100000", "fix that entry")
        elif kind is float and not (_is_number(value) and value > 0):
            why = ("a rate of 0 sends nothing" if _is_number(value) and value == 0
                   else f"{value!r} is not a positive, finite number of requests per second")
            r.refuse(key, why, "use rates above 0; for requests sent as fast as possible, use concurrencies")
        else:
            good.append(value)
    if len(good) == len(values) and len(set(good)) != len(good):
        r.refuse(key, "names a point twice", "list each point once")
    return good if len(good) == len(values) else []


def workloads(file_tables: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[Problem]]:
    """The workload tables by name: the built-ins, then a file's `[workloads.*]` (which may replace one)."""
    tables: dict[str, Any] = dict(BUILT_IN)
    if file_tables is None:
        return tables, []
    problems = [Problem("(file)", key, "is not a section of a workloads file",
                        "put each workload under [workloads.NAME]") for key in file_tables if key != "workloads"]
    given = file_tables.get("workloads", {})
    if not isinstance(given, Mapping):
        return tables, [*problems, Problem("workloads", given, "must be a table of tables", "write [workloads.NAME]")]
    tables.update(given)
    return tables, problems


def pick(tables: Mapping[str, Any], name: str) -> tuple[Workload | None, list[Problem]]:
    if name not in tables:
        return None, [Problem("--workload", name, "is no workload",
                              f"{did_you_mean(name, tables)}pick one of {', '.join(sorted(tables))}, "
                              "or add [workloads.NAME] to a --workloads file")]
    return read_workload(name, tables[name])


def fit_problems(workload: Workload, context_length: int | None, model_path: str,
                 model_files: Collection[str] | None) -> list[Problem]:
    """What keeps `workload` from running against this deployment: a prompt and its answer longer than
    the context the servers take, or no tokenizer to draw prompts from. `model_files`: the names in the
    model directory, None when it cannot be read."""
    problems = []
    longest = workload.input_len + workload.output_len
    if context_length is not None and longest > context_length:
        problems.append(Problem(
            f"workloads.{workload.name}.input_len", workload.input_len,
            f"input_len + output_len = {longest} tokens is longer than the context length {context_length} "
            "(model.context_length): the servers would refuse every request",
            f"lower input_len to at most {max(context_length - workload.output_len, 1)}, or raise "
            "model.context_length where the model allows it"))
    if model_files is None:
        problems.append(Problem("model.path", model_path, "cannot be read on this machine: the prompts are drawn "
                                "from the model's own tokenizer", "run bench on the host that holds the model, "
                                "as a user who can read it"))
    elif not any(name in model_files for name in TOKENIZER_FILES):
        problems.append(Problem("model.path", model_path, f"holds no tokenizer ({' or '.join(TOKENIZER_FILES)})",
                                "point model.path at the model's directory as downloaded, tokenizer files included"))
    return problems
