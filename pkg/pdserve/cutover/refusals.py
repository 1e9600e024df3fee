"""How long the public port refused connections during a cutover.

A background thread opens a TCP connection to the public address about ten times a second and
records whether it was accepted. A refusal window runs from the first refused attempt to the next
accepted one (or to the end of the measurement), so the resolution is one probe interval. The connection
itself is pdserve.probes.net.tcp_accepts; the windows are computed here, from the samples alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.probes.net import CONNECT_TIMEOUT_SEC, tcp_accepts

PROBE_INTERVAL_SEC = 0.1


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the measurement began
    accepted: bool


@dataclass(frozen=True)
class RefusalSummary:
    address: str
    refused_seconds: float
    windows: list[tuple[float, float]]  # (start, end), seconds since the measurement began
    samples: int
    refused_samples: int
    duration: float

    def as_dict(self) -> dict:
        return {
            "address": self.address,
            "refused_seconds": round(self.refused_seconds, 2),
            "windows": [[round(a, 2), round(b, 2)] for a, b in self.windows],
            "samples": self.samples,
            "refused_samples": self.refused_samples,
            "measured_seconds": round(self.duration, 2),
        }


def refusal_windows(samples: list[Sample], end: float) -> list[tuple[float, float]]:
    """Group refused samples into windows: [first refused, next accepted) or [first refused, end)."""
    windows: list[tuple[float, float]] = []
    start: float | None = None
    for sample in samples:
        if not sample.accepted and start is None:
            start = sample.at
        elif sample.accepted and start is not None:
            windows.append((start, sample.at))
            start = None
    if start is not None:
        windows.append((start, max(end, start)))
    return windows


def summarize(address: str, samples: list[Sample], end: float) -> RefusalSummary:
    windows = refusal_windows(samples, end)
    return RefusalSummary(
        address=address,
        refused_seconds=sum(b - a for a, b in windows),
        windows=windows,
        samples=len(samples),
        refused_samples=sum(1 for s in samples if not s.accepted),
        duration=end,
    )


@dataclass
class PortProber:
    """Probe host:port in a background thread until stopped. Use as a context manager."""

    host: str
    port: int
    interval: float = PROBE_INTERVAL_SEC
    connect: Callable[[str, int], bool] = tcp_accepts
    clock: Callable[[], float] = time.monotonic
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0
    _end: float = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> PortProber:
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self._loop, name=f"probe {self.address}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = self.clock()
            accepted = self.connect(self.host, self.port)
            self.samples.append(Sample(began - self._t0, accepted))
            self._stop.wait(max(0.0, self.interval - (self.clock() - began)))

    def stop(self) -> RefusalSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * (self.interval + CONNECT_TIMEOUT_SEC))
        self._end = self.clock() - self._t0
        return summarize(self.address, list(self.samples), self._end)

    def __enter__(self) -> PortProber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
