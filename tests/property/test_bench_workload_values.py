"""`pdserve bench`'s workload fields and the deployment strings bench passes on, given hostile and odd values:
each is either refused with a problem naming `workloads.NAME.FIELD`, or reaches SGLang's benchmark client
exactly. The consumer is the client itself: the pinned SGLang's `sglang.benchmark.serving.cli_main`, run by the
Python the bench tier runs it with (tests/fixtures/bench_client.py) on the argv pdserve builds, with only its
last step (`run_benchmark`) replaced, so its own argparse parser and type checks (`_goodput_slo`, finite
floats) read what pdserve wrote.

Why this matters: a float written with too few digits is another request rate or SLO than the one asked for
(`1234567.5` ms as `1.23457e+06`), and a string that starts with `-` is an option to argparse, not a value.
"""

from __future__ import annotations

import json
import math
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pdserve.bench import client_argv
from pdserve.bench.workload import BUILT_IN, FIELDS, Workload, read_workload
from tests.conftest import require_or_skip
from tests.fixtures import bench_client
from tests.property.strategies import STRINGS

NAME = "prop"
BASE = {"rate": BUILT_IN["smoke"], "concurrency": BUILT_IN["saturate"]}

# Numbers that break formats or sit at a range's edge, and things that are not numbers at all (what TOML can
# carry: no null).
ODD_NUMBERS = [0, -0.0, 1, -1, 0.1, 1 / 3, 1e-7, 5e-324, 2.5e-308, 1234567.5, 3_599_999.999999, 3_600_000,
               3_600_000.0000001, 1e308, math.inf, -math.inf, math.nan, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63,
               10**30, True, False, "1", "", [1], {"x": 1}]


# The client's parser, run where `pdserve bench` runs it (a subprocess of the client's Python), asked one argv
# per line: what its own parse_args makes of it, or its refusal and what it printed.
_DRIVER = r"""
import contextlib, io, json, sys
from sglang.benchmark import serving
seen = []
serving.run_benchmark = seen.append
KEYS = ("model", "tokenizer", "base_url", "random_input_len", "random_output_len", "random_range_ratio",
        "num_prompts", "seed", "request_rate", "max_concurrency", "goodput")
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    sys.argv, text = json.loads(line), io.StringIO()
    seen.clear()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            serving.cli_main()
        answer = {"ok": True, "args": {k: getattr(seen[0], k) for k in KEYS}}
    except SystemExit as exc:
        answer = {"ok": False, "exit": exc.code, "said": text.getvalue()[-2000:]}
    print(json.dumps(answer), flush=True)
"""


class ClientParser:
    """The real client's parser in a subprocess; every exchange has a deadline."""

    def __init__(self, python: Path):
        self.proc = subprocess.Popen([str(python), "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self._answer(deadline_s=180).get("ready"), "the client's parser did not start"

    def _answer(self, deadline_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], deadline_s)
        assert ready, f"the client's parser gave no answer within {deadline_s} s"
        line = self.proc.stdout.readline()
        assert line, f"the client's parser ended (exit {self.proc.poll()})"
        return json.loads(line)

    def parse(self, argv: list[str]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([client_argv.MODULE, *argv[3:]]) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(deadline_s=30)
        if not answer["ok"]:
            pytest.fail(f"pdserve accepted it, SGLang's client refused its argv (exit {answer['exit']}): {argv}\n"
                        f"{answer['said']}")
        return answer["args"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[ClientParser]:
    why = bench_client.missing()
    require_or_skip(why is None, f"SGLang's benchmark client cannot run here ({why})", "PDSERVE_REQUIRE_BENCH")
    parser = ClientParser(bench_client.client_python(tmp_path_factory.mktemp("bench-client")))
    yield parser
    parser.close()


def _same(a: float, b: float) -> bool:
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def _carried_exactly(workload: Workload, client: ClientParser, model: str = "served",
                     tokenizer: str = "/srv/model", base_url: str = "http://127.0.0.1:30001") -> None:
    for point in workload.points():
        argv = client_argv.argv("/opt/sg/bin/python", workload, point, base_url, model, tokenizer, "/tmp/out.jsonl")
        args = client.parse(argv)
        assert (args['model'], args['tokenizer'], args['base_url']) == (model, tokenizer, base_url)
        assert (args['random_input_len'], args['random_output_len']) == (workload.input_len, workload.output_len)
        assert _same(args['random_range_ratio'], workload.range_ratio), \
            (args['random_range_ratio'], workload.range_ratio)
        assert (args['num_prompts'], args['seed']) == (point.prompts, workload.seed)
        if point.kind == "rate":
            assert _same(args['request_rate'], point.value) and args['max_concurrency'] is None, argv
        else:
            assert math.isinf(args['request_rate']) and args['max_concurrency'] == int(point.value), argv
        assert dict(args['goodput']) == workload.slos_ms(), argv


def _check(field: str, value: Any, base: str, client: ClientParser) -> None:
    table = {**BASE[base], field: value}
    workload, problems = read_workload(NAME, table)
    if workload is None:
        assert any(p.field == f"workloads.{NAME}.{field}" for p in problems), (field, value, problems)
        for problem in problems:
            assert problem.field.startswith(f"workloads.{NAME}.") and problem.message and problem.fix, problem
        return
    _carried_exactly(workload, client)


SCALARS = [f for f in FIELDS if f not in ("request_rates", "concurrencies")]


@pytest.mark.parametrize("field", SCALARS)
@pytest.mark.parametrize("base", sorted(BASE))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.sampled_from(ODD_NUMBERS), st.floats(), st.integers(), st.text(max_size=8)))
def test_a_scalar_field_is_refused_by_name_or_reaches_the_client_exactly(field, base, value, client):
    _check(field, value, base, client)


@pytest.mark.parametrize("field", ["request_rates", "concurrencies"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.one_of(st.lists(st.sampled_from(ODD_NUMBERS), max_size=4),
                        st.lists(st.one_of(st.floats(), st.integers()), max_size=4),
                        st.sampled_from([[], "1,2", 3, list(range(1, 40))])))
@example(values=[0.1, 1 / 3, 1234567.5])
@example(values=[1e-7])
def test_a_sweep_is_refused_by_name_or_reaches_the_client_exactly(field, values, client):
    other = "concurrencies" if field == "request_rates" else "request_rates"
    table = {**BASE["rate" if field == "request_rates" else "concurrency"]}
    table.pop(other, None)
    table[field] = values
    if field == "concurrencies":
        table.setdefault("prompts", 16)
    workload, problems = read_workload(NAME, table)
    if workload is None:
        assert all(p.field.startswith(f"workloads.{NAME}.") for p in problems), problems
        assert any(p.field in (f"workloads.{NAME}.{field}", f"workloads.{NAME}.duration_s") for p in problems), problems
        return
    _carried_exactly(workload, client)


@pytest.mark.parametrize("text", [s for s in STRINGS if "\x00" not in s and len(s) < 4096]
                         + ["--help", "-h", "--model", "-x y", "=", "a=b", "--seed=3"])
@pytest.mark.parametrize("which", ["model", "tokenizer", "base_url"])
def test_deployment_strings_reach_the_client_as_values_never_as_options(text, which, client):
    """The served name, the model's directory and the router's URL come from the deployment file; whatever
    `check` lets through, the client must read it as the value it is (a leading `-` included)."""
    workload, _ = read_workload(NAME, BUILT_IN["smoke"])
    assert workload is not None
    _carried_exactly(workload, client, **{which: text})
