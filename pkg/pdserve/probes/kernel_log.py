"""The log lines of pdserve's SGLang plugin, read back from a server's journal.

Their one writer is the plugin, kernels/python/pdserve_kernels/sglang_plugin/status.py (it does not import
pdserve, so the line format is the contract between the two; this module is its only reader). Each line is a
fixed prefix and a one-line JSON object, anywhere in the journal line (SGLang's log format puts a time and
the TP rank before the message):

    pdserve-kernels status: {"requested": "pdserve", "kernels": {"indexer_topk": "pdserve",
        "sparse_mla_decode": "pdserve"}, "reasons": {}, "tp_rank": 0, "device": "cuda:0", "sm": "9.0",
        "sglang": "0.5.23", "pdserve_kernels": "0.1.0", "model": "deepseek_v4"}
    pdserve-kernels fallback: {"op": "sparse_mla_decode", "reason": "...", "shape": "..."}
    pdserve-kernels ran: {"op": "indexer_topk", "shape": "..."}

A status is logged once per attention backend of every scheduler process (so once per TP rank, or more);
a fallback once per distinct (op, reason) in a process; a "ran" line the first time an op ran pdserve's
kernel in a process. Pure: the lines come from pdserve.probes.journal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

STATUS_PREFIX = "pdserve-kernels status: "
FALLBACK_PREFIX = "pdserve-kernels fallback: "
RAN_PREFIX = "pdserve-kernels ran: "
MARK = "pdserve-kernels "  # in every line of the plugin's: what the journal is filtered by
OPS = ("indexer_topk", "sparse_mla_decode")
PDSERVE, SGLANG = "pdserve", "sglang"


@dataclass(frozen=True)
class KernelStatus:
    requested: str
    kernels: dict[str, str]  # op -> "pdserve" | "sglang"
    reasons: dict[str, str]  # op -> why SGLang's kernel serves it
    tp_rank: int | None
    device: str
    sm: str
    sglang: str
    pdserve_kernels: str
    model: str = ""  # whose attention backend: "deepseek_v32" (SGLang's dsa) or "deepseek_v4" (dsv4); "" if unsaid

    def kernel(self, op: str) -> str:
        """Which kernel serves the op; "missing" when the status does not name it."""
        return self.kernels.get(op, "missing")


@dataclass(frozen=True)
class KernelEvent:
    """A fallback (reason set) or a first run of pdserve's kernel (reason None)."""

    op: str
    shape: str
    reason: str | None = None


@dataclass(frozen=True)
class KernelLog:
    statuses: tuple[KernelStatus, ...] = ()
    fallbacks: tuple[KernelEvent, ...] = ()
    ran: tuple[KernelEvent, ...] = ()
    unreadable: tuple[str, ...] = field(default=())  # lines with a prefix whose JSON could not be read


def _object_after(line: str, prefix: str) -> dict[str, Any] | None:
    start = line.find(prefix)
    if start < 0:
        return None
    try:
        # raw_decode: whatever a log formatter appends after the object is not part of it.
        value, _ = json.JSONDecoder().raw_decode(line, start + len(prefix))
    except json.JSONDecodeError:
        raise ValueError(line) from None
    if not isinstance(value, dict):
        raise ValueError(line)
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _names(value: Any) -> dict[str, str]:
    return {str(k): _text(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _status(data: dict[str, Any]) -> KernelStatus:
    rank = data.get("tp_rank")
    return KernelStatus(
        requested=_text(data.get("requested")),
        kernels=_names(data.get("kernels")),
        reasons=_names(data.get("reasons")),
        tp_rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        device=_text(data.get("device")),
        sm=_text(data.get("sm")),
        sglang=_text(data.get("sglang")),
        pdserve_kernels=_text(data.get("pdserve_kernels")),
        model=_text(data.get("model")),
    )


def _event(data: dict[str, Any], with_reason: bool) -> KernelEvent:
    return KernelEvent(op=_text(data.get("op")), shape=_text(data.get("shape")),
                       reason=_text(data.get("reason")) if with_reason else None)


def parse(lines: list[str]) -> KernelLog:
    """The plugin's lines among `lines`, in order; other lines are ignored."""
    statuses: list[KernelStatus] = []
    fallbacks: list[KernelEvent] = []
    ran: list[KernelEvent] = []
    unreadable: list[str] = []
    for line in lines:
        if MARK not in line:
            continue
        try:
            if (data := _object_after(line, STATUS_PREFIX)) is not None:
                statuses.append(_status(data))
            elif (data := _object_after(line, FALLBACK_PREFIX)) is not None:
                fallbacks.append(_event(data, with_reason=True))
            elif (data := _object_after(line, RAN_PREFIX)) is not None:
                ran.append(_event(data, with_reason=False))
        except ValueError:
            unreadable.append(line)
    return KernelLog(tuple(statuses), tuple(fallbacks), tuple(ran), tuple(unreadable))
