"""What the plugin says about itself: one status line per attention backend SGLang builds (one per scheduler
process, more where speculative decoding builds draft backends), and one line per distinct run-time fallback.
Both are one line of text, a fixed prefix and a JSON object, so that `pdserve verify` can read them back from
the server's journal (pdserve parses them; this module is their only writer).

    pdserve-kernels status: {"requested": "pdserve", "kernels": {"indexer_topk": "pdserve", ...}, ...}
    pdserve-kernels fallback: {"op": "sparse_mla_decode", "reason": "...", "shape": "..."}
    pdserve-kernels ran: {"op": "indexer_topk", "shape": "..."}

The status line says what the backend was set up to run; a "ran" line is logged the first time each op
really ran one of pdserve's kernels in the process, so a reader can tell "configured" from "used".

Pure: no torch, no SGLang.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass, field

STATUS_PREFIX = "pdserve-kernels status: "
FALLBACK_PREFIX = "pdserve-kernels fallback: "
RAN_PREFIX = "pdserve-kernels ran: "
OPS = ("indexer_topk", "sparse_mla_decode")
PDSERVE, SGLANG = "pdserve", "sglang"

logger = logging.getLogger("pdserve_kernels")


def _ensure_handler() -> None:
    # SGLang configures the root logger before it loads plugins; a process that did not (a test, a bare
    # interpreter) would drop INFO lines, and the status line is the plugin's proof of what runs.
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


@dataclass
class Status:
    """Which kernel serves each op in this process, and why SGLang's does where it does."""

    requested: str
    kernels: dict[str, str]
    reasons: dict[str, str] = field(default_factory=dict)
    tp_rank: int | None = None
    device: str | None = None
    sm: str | None = None
    sglang: str | None = None
    pdserve_kernels: str | None = None
    lossy_bf16_dequant: bool = False  # the lossy sparse MLA opt-in ($PDSERVE_DSA_LOSSY_BF16_DEQUANT=1) is on
    model: str | None = None  # whose backend: "deepseek_v32" (SGLang's dsa backend) or "deepseek_v4" (dsv4)

    def line(self) -> str:
        return STATUS_PREFIX + json.dumps(self.__dict__, sort_keys=True, separators=(", ", ": "))

    def uses(self, op: str) -> bool:
        return self.kernels.get(op) == PDSERVE


def all_sglang(requested: str, reason: str, **where) -> Status:
    return Status(requested=requested, kernels=dict.fromkeys(OPS, SGLANG), reasons=dict.fromkeys(OPS, reason),
                  **where)


def log_status(status: Status) -> None:
    _ensure_handler()
    logger.info(status.line())


class FallbackLog:
    """Logs a run-time fallback once per (op, reason): a shape that keeps falling back would otherwise log
    on every layer of every step. Reasons name no batch size (the shape field does), and at most
    MAX_REASONS_PER_OP distinct reasons per op are logged, then one line saying the rest are not: a reason that
    still varied per call (an op's message with a length in it, say) cannot fill the server's log."""

    MAX_REASONS_PER_OP = 16

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._per_op: dict[str, int] = {}
        self._lock = threading.Lock()

    def note(self, op: str, reason: str, shape: str) -> bool:
        """Log it if new; True when this call logged."""
        with self._lock:
            if (op, reason) in self._seen:
                return False
            self._seen.add((op, reason))
            count = self._per_op[op] = self._per_op.get(op, 0) + 1
        if count > self.MAX_REASONS_PER_OP + 1:
            return False
        if count == self.MAX_REASONS_PER_OP + 1:
            reason = (f"more than {self.MAX_REASONS_PER_OP} distinct fallback reasons for this op: no further one "
                      f"is logged (this one: {reason})")
        _ensure_handler()
        fallback = json.dumps({"op": op, "reason": reason, "shape": shape}, sort_keys=True)
        logger.warning("%s%s", FALLBACK_PREFIX, fallback)
        return True

    def seen(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._seen)


def batchless(shape) -> str:
    """A tensor shape for a fallback reason, its leading (batch) dimension written B: the reason of a call that
    falls back at every batch size is one reason, logged once."""
    dims = [str(int(d)) for d in tuple(shape)[1:]]
    return "[" + ", ".join(["B", *dims]) + "]"


class RanLog:
    """Logs the first call of each op that ran pdserve's kernel (once per op and process)."""

    def __init__(self) -> None:
        self._ran: set[str] = set()
        self._lock = threading.Lock()

    def note(self, op: str, shape: str) -> bool:
        if op in self._ran:  # the hot path: one set lookup
            return False
        with self._lock:
            if op in self._ran:
                return False
            self._ran.add(op)
        _ensure_handler()
        logger.info("%s%s", RAN_PREFIX, json.dumps({"op": op, "shape": shape}, sort_keys=True))
        return True


def guarded_on_backend(on_backend, backend, model_runner) -> None:
    """`on_backend(backend, model_runner)` (decide and log the status) after SGLang built the backend; a failure there
    must not stop SGLang's server: it is logged, the backend keeps SGLang's kernels (nothing was decided for it),
    and `pdserve verify` then finds no status line for it."""
    try:
        on_backend(backend, model_runner)
    except Exception as e:  # noqa: BLE001 - any failure leaves SGLang's own kernels serving
        _ensure_handler()
        logger.error("pdserve-kernels: could not decide the kernels of %s (%s: %s); SGLang's kernels serve",
                     type(backend).__name__, type(e).__name__, e)
