"""What the cutover needs from the host (`Edge`) and what crosses that line. The real edge is
pdserve.cutover.host; the unit tests drive the machine through a fake with the same methods."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pdserve.cutover.boot_links import UnitFiles
from pdserve.cutover.refusals import RefusalSummary
from pdserve.probes.systemctl import UnitState
from pdserve.schema.boot import Layout


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    unit: str | None  # the systemd unit whose cgroup holds the process; None when it is in none


class GpuUnknown(Exception):
    """The GPU holders cannot be read here (no NVML, no driver); the check is skipped with this reason."""


class Edge(Protocol):
    def show(self, units: Sequence[str]) -> dict[str, UnitState]: ...
    def start(self, units: Sequence[str]) -> None: ...
    def stop(self, units: Sequence[str], timeout: float) -> None: ...
    def add_wants(self, target: str, units: Sequence[str]) -> None: ...
    def disable(self, units: Sequence[str]) -> None: ...
    def reset_failed(self, units: Sequence[str]) -> None: ...
    def unit_files(self, states: dict[str, UnitState]) -> UnitFiles: ...
    def smoke(self, layout: Layout) -> Check: ...
    def gpu_processes(self, gpus: Sequence[int]) -> list[GpuProcess]: ...
    def clock(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class Measurement(Protocol):
    """The refused-connection prober, seen from the cutover: started before the first change."""

    def start(self) -> object: ...
    def stop(self) -> RefusalSummary: ...
