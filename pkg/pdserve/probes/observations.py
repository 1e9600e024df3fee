"""Plain records of what the probes saw. Checks read these; tests build them by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdserve.probes.answers import Mismatch


class HttpAnswer:
    """What every observation of one HTTP answer says of itself; the observation has the fields url,
    status (None: no answer) and error (with a status: an answer pdserve could not read, or a redirect)."""

    url: str
    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    def describe(self) -> str:
        if self.status is None:
            return f"{self.url}: no answer ({self.error})"
        return f"{self.url}: HTTP {self.status}" + (f", {self.error}" if self.error else "")


@dataclass(frozen=True)
class HttpObs(HttpAnswer):
    url: str
    status: int | None = None  # None: no HTTP answer at all
    body: Any = None  # parsed JSON (bounded in size and depth), or text for non-JSON answers
    error: str | None = None  # no answer: why; an answer: why it could not be read, or the redirect
    location: str | None = None  # a 3xx's Location, never followed
    # No connection could be made (refused, or no answer to the connect): nothing serves there. Unlike an
    # answer that did not come in time, from a server that is there but slow.
    unreachable: bool = False


@dataclass(frozen=True)
class GpuObs:
    index: int
    name: str
    memory_used: int  # bytes
    memory_total: int
    pids: tuple[int, ...] = ()
    pci_bus_id: str = ""  # as NVML writes it (00000000:3B:00.0); "" when not read


@dataclass(frozen=True)
class ProcNuma:
    pid: int
    command: str
    cpus_allowed: frozenset[int] | None
    mems_allowed: frozenset[int] | None
    pages_by_node: dict[int, int] | None  # from /proc/<pid>/numa_maps; None when unreadable


@dataclass(frozen=True)
class ToolCallObs:
    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class ChatObs:
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCallObs, ...] = ()
    finish_reason: str | None = None
    error: str | None = None  # the request failed: status and message
    status: int | None = None
    unexpected: Mismatch | None = None  # an answer that is not a chat completion: what came, what should have


@dataclass(frozen=True)
class StreamObs:
    chunks: int = 0
    content_chunks: int = 0
    content: str = ""
    reasoning_chunks: int = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    unexpected: Mismatch | None = None  # a chunk that is not a chat completion chunk (the stream stops there)


@dataclass(frozen=True)
class PortProbe:
    address: str
    port: int
    what: str  # "prefill port", "decode port", "prefill bootstrap port"
    reachable: bool
    error: str | None = None


@dataclass(frozen=True)
class AuthObs:
    without_key: int | None
    with_key: int | None
    error: str | None = None
    details: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Unavailable(Exception):
    """A probe cannot run on this host (no systemd, no NVML, ...): the check skips with this reason."""

    reason: str

    def __str__(self) -> str:
        return self.reason
