"""Each SGLang server as it runs: KV capacity against the floor, and its resolved args as configured."""

from __future__ import annotations

import re

from pdserve.probes.answers import Capacity, Mismatch, ModelInfo, ServerArgs, fit
from pdserve.probes.observations import HttpObs
from pdserve.verify.expect import Expectations, WorkerExpectation
from pdserve.verify.result import CheckResult, failed, passed

# SGLang's scheduler logs this once the KV pool is allocated.
CAPACITY_LINE = re.compile(r"max_total_num_tokens=(\d+)")


def capacity_from_journal(lines: list[str]) -> int | None:
    for line in reversed(lines):
        match = CAPACITY_LINE.search(line)
        if match:
            return int(match.group(1))
    return None


def check_kv(exp: Expectations, w: WorkerExpectation, info: HttpObs, journal: list[str] | None,
             journal_on: str | None = None) -> CheckResult:
    """journal_on: the host whose journal holds the server's lines, when it is not this one (multi-host)."""
    cid = f"kv.{w.id}"
    expected = f"max_total_num_tokens >= {exp.kv_floor} (floor; --kv-floor)"
    tokens, source = None, ""
    capacity = fit(Capacity, info.body, f"{w.url}/server_info") if info.ok else None
    if isinstance(capacity, Capacity) and capacity.max_total_num_tokens is not None:
        tokens, source = capacity.max_total_num_tokens, f"{w.url}/server_info"
    elif journal:
        tokens, source = capacity_from_journal(journal), f"journal of {w.unit}"
    if tokens is None:
        why = (info.describe() if not info.ok else str(capacity) if isinstance(capacity, Mismatch)
               else "/server_info has no max_total_num_tokens")
        if journal_on:
            why += f"; its journal is on host {journal_on} (`pdserve verify --host {journal_on}` there reads it)"
        elif journal is None:
            why += "; no journal to fall back on (no systemd)"
        else:
            why += "; no `max_total_num_tokens=` line in the journal"
        return failed(cid, why, expected,
                      f"the {w.role} server is not up: `journalctl -u {w.unit} -n 200`")
    observed = f"{tokens} tokens (from {source})"
    if tokens < exp.kv_floor:
        return failed(cid, observed, expected,
                      f"raise {w.field}.mem_fraction_static (now {w.mem_fraction_static:g}), lower "
                      f"max_running_requests or the CUDA graph batch sizes, or use a smaller kv_cache_dtype; "
                      f"a KV pool below the floor cannot hold one full request")
    return passed(cid, observed, expected)


def _parser(info: ServerArgs, model_info: ModelInfo | None, key: str):
    if model_info and key in model_info.model_fields_set:
        return getattr(model_info, key)
    return getattr(info, key)


def _not_sglang(w: WorkerExpectation) -> str:
    return (f"the answer on the {w.role} port is not SGLang's: `systemctl cat {w.unit}` and `ss -ltnp` name what "
            f"listens there; see versions.{w.id}")


def check_server_args(exp: Expectations, w: WorkerExpectation, info: HttpObs, model_info: HttpObs) -> CheckResult:
    cid = f"server.{w.id}"
    want: dict[str, object] = {"disaggregation_mode": w.mode, "tp_size": w.tp_size,
                               "mem_fraction_static": w.mem_fraction_static}
    if exp.context_length:
        want["context_length"] = exp.context_length
    if w.chunked_prefill_size:
        want["chunked_prefill_size"] = w.chunked_prefill_size
    want["reasoning_parser"] = exp.reasoning_parser
    want["tool_call_parser"] = exp.tool_call_parser
    expected = ", ".join(f"{k}={v}" for k, v in want.items())
    if not info.ok or not isinstance(info.body, dict):
        return failed(cid, info.describe(), expected, f"the {w.role} server is not up: `journalctl -u {w.unit}`")
    body = fit(ServerArgs, info.body, f"{w.url}/server_info")
    minfo = fit(ModelInfo, model_info.body, f"{w.url}/model_info") if model_info.ok else None
    for odd in (body, minfo):
        if isinstance(odd, Mismatch):
            return failed(cid, odd.observed, f"{expected}; {odd.expected}", _not_sglang(w))
    assert isinstance(body, ServerArgs) and not isinstance(minfo, Mismatch)
    got = {}
    for key in want:
        if key in ModelInfo.model_fields:
            got[key] = _parser(body, minfo, key)
        else:
            got[key] = getattr(body, key)
    got_note = f"context_length={body.context_length} (model default)" if exp.context_length is None else ""
    mismatched = [k for k, v in want.items() if not _same(got[k], v)]
    observed = ", ".join(f"{k}={_text(got[k])}" for k in want) + (f", {got_note}" if got_note else "")
    if mismatched:
        fixes = []
        if "disaggregation_mode" in mismatched:
            fixes.append(f"{w.url} reports disaggregation_mode={got['disaggregation_mode']}: a different server "
                         f"answers on the {w.role} port, or its unit runs other flags")
        others = [k for k in mismatched if k != "disaggregation_mode"]
        if others:
            fixes.append(f"{', '.join(others)} differ from the deployment: the unit runs stale flags; "
                         f"re-render the units and `systemctl restart {w.unit}`")
        return failed(cid, observed, expected, "; ".join(fixes),
                      [f"{k}: running {_text(repr(got[k]))}, configured {want[k]!r}" for k in mismatched])
    return passed(cid, observed, expected)


def _text(value: object) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(got - want) < 1e-6
    return got == want
