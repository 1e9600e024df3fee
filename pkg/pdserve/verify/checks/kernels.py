"""Which DSA decode kernels an SGLang server runs, from what pdserve's SGLang plugin logged in the server's
current invocation (pdserve.probes.kernel_log reads its lines): when the deployment asked for pdserve's
(`<role>.attention_kernels = "pdserve"`), every TP rank's status must say pdserve for both ops."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.probes.kernel_log import OPS, PDSERVE, KernelLog, KernelStatus
from pdserve.probes.systemctl import UnitState
from pdserve.verify.result import CheckResult, failed, passed, skipped, warned

PLUGIN_FIX = ("the SGLang Python must have the pdserve-kernels distribution (its entry point "
              "sglang.srt.plugins = pdserve_kernels): the flake's sglang-env includes it; elsewhere install "
              "kernels/python into that Python (`pdserve check --host` says whether it is there)")


@dataclass(frozen=True)
class KernelsAsked:
    """What the deployment says of one SGLang server."""

    role: str
    unit: str
    requested: str  # <role>.attention_kernels
    tp_size: int  # the TP ranks this unit runs (of a multi-node server: one node's share)
    first_rank: int = 0  # the first of them: SGLang numbers ranks across the nodes (node n: n * tp_size ...)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.tp_size)


def _cid(asked: KernelsAsked) -> str:
    return f"kernels.{asked.role}"


def _expected(asked: KernelsAsked) -> str:
    first, last = asked.ranks[0], asked.ranks[-1]
    ranks = f"TP rank {first}-{last}" if last > first else f"TP rank {first}"
    return f"pdserve's kernels for {' and '.join(OPS)} on {ranks} (pdserve-kernels status lines)"


def _describe(status: KernelStatus) -> str:
    ops = ", ".join(f"{op} {status.kernel(op)}" for op in OPS)
    model = f"{status.model}, " if status.model else ""
    where = f"{model}{status.device or '?'} sm {status.sm or '?'}, sglang {status.sglang or '?'}, " \
            f"pdserve-kernels {status.pdserve_kernels or '?'}"
    return f"TP rank {status.tp_rank if status.tp_rank is not None else '?'}: {ops} ({where})"


def _off(status: KernelStatus) -> list[str]:
    """Why the status is not pdserve's kernels for both ops (empty: it is)."""
    why = []
    if status.requested != PDSERVE:
        why.append(f"the process was started with PDSERVE_DSA_KERNELS={status.requested or '(unset)'}")
    for op in OPS:
        if status.kernel(op) != PDSERVE:
            why.append(f"{op}: {status.kernel(op)} ({status.reasons.get(op, 'no reason given')})")
    return why


def _log_details(log: KernelLog, incomplete: str | None) -> list[str]:
    details = [f"fallback: {e.op}: {e.reason} (shape {e.shape})" for e in log.fallbacks]
    details += [f"ran pdserve's {e.op} (first call, shape {e.shape})" for e in log.ran]
    details += [f"unreadable plugin line: {line}" for line in log.unreadable]
    if incomplete:
        details.append(f"journal scan incomplete: {incomplete}")
    return details


def check_kernels(asked: KernelsAsked, state: UnitState | None, log: KernelLog | None,
                  incomplete: str | None = None) -> CheckResult:
    """state/log: the unit and the plugin's lines of its current invocation (None: not read, because the
    deployment did not ask for pdserve's kernels). incomplete: why the journal scan stopped early."""
    cid, expected = _cid(asked), _expected(asked)
    if asked.requested != PDSERVE:
        return skipped(cid, f"{asked.role}.attention_kernels = \"{asked.requested}\": SGLang's own kernels, "
                       "nothing to check", "", f"set {asked.role}.attention_kernels = \"pdserve\" to run pdserve's")
    assert state is not None and log is not None
    if not state.running:
        if asked.role == "fallback":
            return skipped(cid, f"{state.describe()}: the fallback is not running", expected)
        return failed(cid, f"{state.describe()}: no server, so no kernels", expected,
                      f"start {asked.unit} (units.{asked.role} says why it is not running)")
    by_rank: dict[int | None, list[KernelStatus]] = {}
    for status in log.statuses:
        by_rank.setdefault(status.tp_rank, []).append(status)
    details = [_describe(s) for s in log.statuses] + _log_details(log, incomplete)
    off = [f"TP rank {s.tp_rank if s.tp_rank is not None else '?'}: {why}" for s in log.statuses for why in _off(s)]
    if off:
        restart = any(s.requested != PDSERVE for s in log.statuses)
        fix = (f"restart {asked.unit}: its current invocation was started without attention_kernels = "
               "\"pdserve\" in its environment (or render and install the units again first)") if restart else (
            "the reasons (observed, details) say why the plugin kept SGLang's kernel: fix that, or set "
            f"{asked.role}.attention_kernels = \"sglang\"")
        return failed(cid, "; ".join(off), expected, fix, details)
    missing = [rank for rank in asked.ranks if rank not in by_rank]
    if missing:
        seen = f"{len(log.statuses)} status line(s)" if log.statuses else "no pdserve-kernels status line"
        observed = f"{seen} in this invocation; none from TP rank(s) {', '.join(map(str, missing))}"
        if incomplete:
            return skipped(cid, f"{observed}, but the journal scan stopped early: {incomplete}", expected)
        if state.active_state != "active":
            # The plugin logs while the model loads; the unit is active only once the server is ready.
            return failed(cid, f"{state.describe()}, not ready yet: {observed}", expected,
                          f"wait for {asked.unit} to be ready (pdserve verify --wait SECONDS)", details)
        return failed(cid, observed, expected, f"{asked.unit} is ready but the plugin did not report: "
                      f"{PLUGIN_FIX}; then restart {asked.unit}", details)
    observed = f"pdserve's kernels on all {asked.tp_size} TP rank(s)"
    if log.fallbacks:
        ops = sorted({e.op for e in log.fallbacks})
        return warned(cid, f"{observed}; {len(log.fallbacks)} run-time fallback(s) to SGLang's kernel "
                      f"({', '.join(ops)})", expected,
                      "shapes pdserve's kernels do not support ran SGLang's kernel (see details); nothing to do "
                      "unless those shapes matter", details)
    return passed(cid, observed, expected, details)
