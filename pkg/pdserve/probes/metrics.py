"""A Prometheus /metrics endpoint, read with a size bound and a total deadline, and its text parsed.

The text exposition format (version 0.0.4), as prometheus_client (SGLang) and the router's Rust exporter
write it: `# HELP` / `# TYPE` lines, then `name{label="value",...} value [timestamp]`. The parse is
lenient: a line it cannot read is counted and kept as an example, never raised, so one odd line does
not hide the families around it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import httpx

from pdserve.probes import http
from pdserve.probes.observations import HttpAnswer

MAX_BYTES = 8 * 1024 * 1024  # SGLang's scrape with every histogram is ~100 KB; anything near this is not /metrics
BAD_LINE_EXAMPLES = 3


@dataclass(frozen=True)
class Sample:
    name: str  # as exposed: a histogram's samples are NAME_bucket, NAME_count and NAME_sum
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class MetricsObs(HttpAnswer):
    url: str
    status: int | None = None  # None: no (usable) HTTP answer
    samples: tuple[Sample, ...] = ()
    declared: dict[str, str] = field(default_factory=dict)  # family -> type, from `# TYPE` lines
    bad_lines: int = 0
    bad_examples: tuple[str, ...] = ()
    error: str | None = None

    def series(self, name: str) -> list[Sample]:
        """A family's samples: NAME itself, or a histogram's NAME_bucket / _count / _sum."""
        return [s for s in self.samples if s.name == name or (s.name.startswith(name) and
                s.name[len(name):] in ("_bucket", "_count", "_sum"))]


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_TYPE = re.compile(rf"^#\s*TYPE\s+({_NAME})\s+(\w+)")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], value)


def _labels(text: str) -> tuple[tuple[str, str], ...] | None:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if not match:
            return None if text[pos:].strip() else tuple(labels)
        labels.append((match.group(1), _unescape(match.group(2))))
        pos = match.end()
    return tuple(labels)


def _value(text: str) -> float | None:
    try:
        return float(text)  # float() reads "+Inf", "-Inf" and "NaN" as Prometheus writes them
    except ValueError:
        return None


def parse(url: str, text: str) -> MetricsObs:
    """Every sample of an exposition, and the families it declares with `# TYPE` (declared, maybe empty)."""
    samples: list[Sample] = []
    declared: dict[str, str] = {}
    bad: list[str] = []
    bad_count = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            typed = _TYPE.match(line)
            if typed:
                declared[typed.group(1)] = typed.group(2)
            continue
        match = _SAMPLE.match(line)
        labels = _labels(match.group(2) or "") if match else None
        value = _value(match.group(3)) if match else None
        if match is None or labels is None or value is None:
            bad_count += 1
            if len(bad) < BAD_LINE_EXAMPLES:
                bad.append(line[:200])
            continue
        samples.append(Sample(match.group(1), labels, value))
    return MetricsObs(url, 200, tuple(samples), declared, bad_count, tuple(bad))


def read(client: httpx.Client, url: str, timeout: float, max_bytes: int = MAX_BYTES) -> MetricsObs:
    """GET url and parse it; never raises for network trouble. Read through pdserve.probes.http, as every
    answer is: `timeout` bounds the whole read, `max_bytes` the body after decompression."""
    try:
        response, body = http.read(client, "GET", url, max_bytes, seconds=timeout, timeout=timeout)
    except httpx.HTTPError as exc:
        return MetricsObs(url, None, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if response.status_code != 200:
        return MetricsObs(url, response.status_code)
    return parse(url, body.decode("utf-8", errors="replace"))


def total(obs: MetricsObs, name: str, **match: str) -> float | None:
    """The sum of a counter's or gauge's series whose labels include `match`; None when it has none (a
    labelled prometheus_client counter has no series before its first increment). NaN series are left out."""
    values = [s.value for s in obs.series(name) if all(s.label(k) == v for k, v in match.items())]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) if values else None
