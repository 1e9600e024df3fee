"""Real SGLang prefill and decode servers and the real router, smg (behind an API key) on two GPUs, or on
one shared GPU, started from pdserve's rendered commands: chat through the router, KV moved between the
servers, `pdserve verify`, the key enforced, and a prefill kill -9 under load with the router left running.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time

import httpx
import pytest

from tests.gpu import crash
from tests.gpu.load import EMPTY, as_report
from tests.gpu.pd_run import SERVED_NAME, PDRun, group_members

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

HTTP_TIMEOUT = 60.0
# Long enough that the KV moved per request is well above a page, short of the context length.
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
_SAMPLE = re.compile(r"^(sglang:[A-Za-z0-9_:]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN|\+Inf|-Inf)\s*$", re.MULTILINE)


def api_key(pd: PDRun) -> str:
    return crash.read_key(pd.deployment.router.api_key_file)


def client(pd: PDRun, key: str | None = None):
    from openai import OpenAI

    return OpenAI(base_url=f"{pd.url('router')}/v1", api_key=key or api_key(pd), timeout=HTTP_TIMEOUT,
                  max_retries=0)


def metric_sums(pd: PDRun, role: str) -> dict[str, float]:
    """Every sglang:* sample of a server's /metrics, summed over label sets."""
    text = httpx.get(f"{pd.url(role)}/metrics", timeout=HTTP_TIMEOUT).text
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        if value not in ("NaN", "+Inf", "-Inf"):
            sums[name] = sums.get(name, 0.0) + float(value)
    return sums


def moved(before: dict[str, float], after: dict[str, float], word: str = "transfer") -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after
            if word in name and after[name] - before.get(name, 0.0) > 0}


def test_both_servers_report_kv_capacity(pd, report):
    capacity = {}
    for role in ("prefill", "decode"):
        info = httpx.get(f"{pd.url(role)}/server_info", timeout=HTTP_TIMEOUT).json()
        tokens = info.get("max_total_num_tokens")
        assert isinstance(tokens, int) and tokens >= 4096, (role, tokens)
        assert info.get("disaggregation_mode") == role, info.get("disaggregation_mode")
        capacity[role] = tokens
        report.setdefault("versions", {})[role] = info.get("version")
    report["max_total_num_tokens"] = capacity


def test_chat_through_the_router(pd, report):
    response = client(pd).chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Say hello."}], max_tokens=32, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0, response.usage
    report["chat"] = {"finish_reason": choice.finish_reason, "usage": response.usage.model_dump(),
                      "content": (choice.message.content or "")[:80]}


def test_streaming_chat_and_first_token_latency(pd, report):
    c = client(pd)
    first_token_s, chunk_counts = [], []
    for i in range(6):
        start = time.monotonic()
        first = None
        chunks = usage = finish = 0
        stream = c.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": f"Count {i}."}],
                                           max_tokens=16, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        for event in stream:
            if event.usage is not None:
                usage = event.usage.completion_tokens
            for choice in event.choices:
                if choice.delta.content:
                    chunks += 1
                    first = first if first is not None else time.monotonic() - start
                finish = choice.finish_reason or finish
        assert first is not None and chunks >= 2 and finish and usage > 0, (chunks, finish, usage)
        first_token_s.append(first)
        chunk_counts.append(chunks)
    # The first request pays one-time costs (connection setup, first transfer handshake): report it apart.
    report["first_token_ms"] = {"first_request": round(first_token_s[0] * 1000, 1),
                                "median_of_next_5": round(statistics.median(first_token_s[1:]) * 1000, 1)}
    report["stream_chunks"] = chunk_counts


def test_kv_moves_from_prefill_to_decode(pd, report):
    before = {role: metric_sums(pd, role) for role in ("prefill", "decode")}
    requests = 4
    for _ in range(requests):
        client(pd).chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": LONG_PROMPT}],
                                           max_tokens=4, temperature=0)
    # Metrics are exported by the scheduler process and can lag the reply a little.
    deadline = time.monotonic() + 30
    while True:
        after = {role: metric_sums(pd, role) for role in ("prefill", "decode")}
        deltas = {role: moved(before[role], after[role]) for role in ("prefill", "decode")}
        done = deltas["prefill"].get("sglang:kv_transfer_total_mb_count", 0) >= requests
        if done or time.monotonic() > deadline:
            break
        time.sleep(1)
    report["kv_transfer_deltas"] = deltas
    prefill = deltas["prefill"]
    assert prefill.get("sglang:kv_transfer_total_mb_count", 0) >= requests, deltas
    assert prefill.get("sglang:kv_transfer_total_mb_sum", 0) > 0, deltas
    assert deltas["decode"], f"no transfer metric moved on decode: {deltas}"


def test_pdserve_verify_passes_what_applies(pd, report):
    done = subprocess.run([pd.tools.pdserve, "verify", "--config", str(pd.config), "--json",
                           "--probe-timeout", "20", "--chat-timeout", "120"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    report["verify"] = {cid: [c["status"], c["observed"]] for cid, c in checks.items()}
    status = {cid: c["status"] for cid, c in checks.items()}
    must_pass = ["router.readiness", "router.workers", "kv.prefill", "kv.decode", "server.prefill", "server.decode",
                 "e2e.chat", "e2e.stream", "exposure.ports", "exposure.auth", "versions.router",
                 # On a shared GPU too: the verifier expects p + d*(1-p) of it, both servers' processes on it.
                 "gpu.memory", "gpu.processes"]
    if pd.deployment.prefill.numa_node is not None:
        must_pass += ["numa.prefill", "numa.decode"]
    assert {cid: status[cid] for cid in must_pass if status[cid] != "pass"} == {}, report["verify"]
    # No reasoning or tool parser on this model: those checks say why they did not run.
    for cid in ("e2e.reasoning", "e2e.tools"):
        assert status[cid] == "skip", checks[cid]
    # The pins are SGLang 0.5.23; this machine runs the release that matches its torch. The version checks
    # must see that, and they are the only checks allowed to fail.
    failing = {cid for cid, s in status.items() if s == "fail"}
    assert failing <= {"versions.prefill", "versions.decode"}, report["verify"]
    for cid in failing:
        role = cid.split(".")[1]
        running = httpx.get(f"{pd.url(role)}/server_info", timeout=HTTP_TIMEOUT).json()["version"]
        assert running in checks[cid]["observed"], checks[cid]


def test_the_router_refuses_requests_without_its_key_and_the_key_is_in_no_command_line(pd, report):
    url = f"{pd.url('router')}/v1/chat/completions"
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    no_key = httpx.post(url, json=body, timeout=HTTP_TIMEOUT)
    wrong_key = httpx.post(url, json=body, headers={"Authorization": "Bearer not-the-key"}, timeout=HTTP_TIMEOUT)
    answer = client(pd).chat.completions.create(model=SERVED_NAME, messages=body["messages"], max_tokens=4)
    report["api_key"] = {"without_key": no_key.status_code, "wrong_key": wrong_key.status_code,
                         "with_key_completion_tokens": answer.usage.completion_tokens}
    assert (no_key.status_code, wrong_key.status_code) == (401, 401), (no_key.text, wrong_key.text)
    assert answer.usage.completion_tokens > 0
    key = api_key(pd).encode()
    for role, proc in pd.procs.items():
        for pid in group_members(proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            assert key not in cmdline, f"the API key shows in the command line of {role} process {pid}"


# Last: it kills and restarts the prefill.
def test_prefill_kill_9_under_load_the_keyed_router_stays_up_and_requests_succeed_again(pd, report):
    plan = crash.CrashPlan(role="prefill", ready_timeout_s=240.0)
    result = crash.kill_under_load(pd, plan, SERVED_NAME)
    s = result.summary
    report["prefill_kill_under_load"] = {
        "plan": plan.__dict__, "old_pid": result.old_pid, "new_pid": result.new_pid,
        "restart_ready_after_start_s": round(result.restart_ready_after_start_s, 1),
        "load_s": round(result.load_s, 1), **as_report(s), "timeline": result.timeline}
    print("\n" + crash.table(result, plan))
    assert result.new_pid != result.old_pid
    assert s.failed_before == 0, "the deployment failed requests before the kill: " + str(s.details)
    assert s.sent >= plan.rate * plan.before_s * 0.8, s
    # The router process was never touched: its port must accept connections throughout.
    assert s.longest_refused_s == 0.0, s
    # Nothing fails silently: every failure is an error the client sees.
    assert EMPTY not in s.causes, s.details
    assert s.answered_again_s is not None and s.all_succeed_from_s is not None, \
        f"requests never succeeded again: {s.causes} {s.details}"
