"""Each SGLang server as it runs: KV capacity against the floor, and its resolved args as configured."""

from __future__ import annotations

import re

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
    if info.ok and isinstance(info.body, dict) and isinstance(info.body.get("max_total_num_tokens"), int):
        tokens, source = info.body["max_total_num_tokens"], f"{w.url}/server_info"
    elif journal:
        tokens, source = capacity_from_journal(journal), f"journal of {w.unit}"
    if tokens is None:
        why = info.describe() if not info.ok else "/server_info has no max_total_num_tokens"
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


def _parser(info: dict, model_info: dict | None, key: str):
    if model_info and key in model_info:
        return model_info.get(key)
    return info.get(key)


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
    body = info.body
    minfo = model_info.body if model_info.ok and isinstance(model_info.body, dict) else None
    got = {}
    for key in want:
        if key in ("reasoning_parser", "tool_call_parser", "disaggregation_mode"):
            got[key] = _parser(body, minfo, key)
        else:
            got[key] = body.get(key)
    if exp.context_length is None:
        got_note = f"context_length={body.get('context_length')} (model default)"
    else:
        got_note = ""
    mismatched = [k for k, v in want.items() if not _same(got[k], v)]
    observed = ", ".join(f"{k}={got[k]}" for k in want) + (f", {got_note}" if got_note else "")
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
                      [f"{k}: running {got[k]!r}, configured {want[k]!r}" for k in mismatched])
    return passed(cid, observed, expected)


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(got - want) < 1e-6
    return got == want
