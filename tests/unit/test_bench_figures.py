"""`pdserve bench` reads the client's result record strictly (issue 40): the record SGLang 0.5.23's client
wrote in front of the stand-in workers gives every figure; a misbehaving client or a hand-edited file
(NaN, Infinity, huge or oddly typed numbers, a truncated line) gives a point without figures and the
reason, never a crash and never a number in a table that is not one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.bench.figures import (
    ALL_FIGURES,
    ERRORS,
    FIGURES,
    GOODPUT_KEYS,
    KV_TRANSFER,
    inconsistencies,
    read_record,
)
from pdserve.bench.sweep import Sweep
from pdserve.bench.table import sweep_lines
from pdserve.bench.workload import Point
from pdserve.schema import strict_json
from tests.property.strict_json import strict_loads

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "sglang-0.5.23-bench_serving-standin.jsonl"
POINT = Point("rate", 5.0, 3)


def recorded() -> dict:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def as_bytes(record) -> bytes:
    return json.dumps(record).encode()


def test_the_recorded_client_record_gives_every_figure_consistently():
    result = read_record(POINT, RECORDED.read_bytes(), kv_transfer_ms=1.5)
    assert result.measured, result.failure
    assert set(result.figures) == {f.key for f in ALL_FIGURES}
    assert result.completed == 3 and result.figures[ERRORS.key] == 0 and result.figures[KV_TRANSFER.key] == 1.5
    assert result.figures["ttft_p50_ms"] == pytest.approx(recorded()["median_ttft_ms"])
    assert inconsistencies(result) == []


def without_goodput() -> dict:
    """The recorded record as a client run without --goodput writes it (SGLang 0.5.17's has no such option):
    no goodput keys at all."""
    return {k: v for k, v in recorded().items() if k not in ("request_goodput", "slo_attainment",
                                                             "slo_attainment_by_metric")}


def test_a_client_run_without_goodput_is_measured_without_its_figures():
    result = read_record(POINT, as_bytes(without_goodput()), kv_transfer_ms=1.5, goodput=False)
    assert result.measured, result.failure
    assert set(result.figures) == {f.key for f in ALL_FIGURES} - GOODPUT_KEYS
    assert inconsistencies(result) == []
    lines = "\n".join(sweep_lines(Sweep("pd", "http://x", [result])))
    assert "TTFT p50" in lines and "goodput" not in lines and "SLO attainment" not in lines


def test_goodput_asked_for_and_missing_is_unreadable():
    result = read_record(POINT, as_bytes(without_goodput()), goodput=True)
    assert not result.measured and "request_goodput" in (result.failure or "")


def test_the_last_record_counts_when_the_client_appended_several():
    first, second = recorded(), {**recorded(), "completed": 2}
    result = read_record(POINT, as_bytes(first) + b"\n" + as_bytes(second) + b"\n")
    assert result.completed == 2 and result.figures[ERRORS.key] == 1


def test_failed_requests_are_counted_by_cause():
    record = {**recorded(), "completed": 1,
              "errors": ["", "Traceback (most recent call last):\n  ...\naiohttp.ClientPayloadError: truncated",
                         "Service Unavailable: " + "x" * 500]}
    result = read_record(POINT, as_bytes(record))
    assert result.figures[ERRORS.key] == 2
    assert result.errors["aiohttp.ClientPayloadError: truncated"] == 1
    assert all(len(cause) <= 165 for cause in result.errors)


@pytest.mark.parametrize(("data", "words"), [
    (b"", "wrote no result"),
    (b'{"completed": 3, "median_ttft_ms": 1.', "unreadable"),  # cut mid-write
    (b'{"completed": 3, "median_ttft_ms": NaN}', "NaN is no JSON number"),
    (b'{"median_ttft_ms": Infinity}', "Infinity is no JSON number"),
    (b'{"completed": 1' + b"0" * 60 + b"}", "digits"),
    (b"[1, 2]", "not a JSON object"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_a_broken_record_is_a_point_without_figures_and_its_reason(data, words):
    result = read_record(POINT, data)
    assert not result.measured and words in result.failure, result.failure
    assert result.figures == {}


@pytest.mark.parametrize(("key", "value", "words"), [
    ("median_ttft_ms", None, "not a number"),
    ("median_ttft_ms", "12", "not a number"),
    ("median_ttft_ms", True, "not a number"),
    ("p99_itl_ms", -1.0, "out of range"),
    ("output_throughput", 1e300, "out of range"),
    ("completed", 10**20, "out of range"),
])
def test_an_oddly_typed_or_huge_figure_is_refused(key, value, words):
    result = read_record(POINT, as_bytes({**recorded(), key: value}))
    assert not result.measured and key in result.failure and words in result.failure


def test_inconsistent_figures_are_named():
    record = {**recorded(), "median_ttft_ms": 50.0, "p90_ttft_ms": 10.0, "completed": 9,
              "output_throughput": recorded()["output_throughput"] * 2,
              "request_goodput": recorded()["request_throughput"] * 3}
    found = " | ".join(inconsistencies(read_record(POINT, as_bytes(record))))
    for words in ("ttft percentiles out of order", "9 requests done of 3", "output tok/s", "goodput"):
        assert words in found, found


# Lone surrogates included: the client's JSON may carry them as escapes, and error texts reach the report.
TEXT = st.characters(codec=None, exclude_categories=()) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([f.source for f in FIGURES] + ["completed", "duration", "errors",
                                                                         "total_input_tokens", "total_output_tokens"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                                 st.lists(st.text(TEXT, max_size=5), max_size=3))))
def test_whatever_the_record_holds_the_json_report_is_strict_json(changes):
    record = {**recorded(), **changes}
    data = json.dumps(record).encode()  # json writes NaN and Infinity as the client's json.dumps does
    result = read_record(POINT, data)
    for value in result.figures.values():
        assert math.isfinite(value) and 0 <= value <= 1e12
    sweep = Sweep("pd", "http://x", [result])
    loaded = strict_loads(strict_json.dumps(sweep.as_dict()), "bench --json")
    assert loaded["points"][0]["completed"] == result.completed
