"""The metrics checks on recorded exposition text, and the bounded reader and parser under them.

The texts are real answers: the router's (smg 1.13.0's) Prometheus listener just after /readiness turned 200,
recorded whole, with chat requests' lines cut from its later answers, and the stand-in's SGLang 0.5.23 families
(prefill, idle).
"""

import time

import httpx
import pytest

from pdserve.probes import metrics as probe
from pdserve.schema.loading import load
from pdserve.verify import runner
from pdserve.verify.checks import metrics
from pdserve.verify.expect import expectations
from pdserve.verify.hosts import checks_for
from tests.fixtures.smg_exposition import recorded

DEP = load().deployment
EXP = expectations(DEP)
CHECKS = checks_for(EXP)

SCHED = 'model_name="standin",engine_type="prefill",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
PREFILL_IDLE = f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{SCHED}}} 0.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{SCHED}}} 0.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{SCHED}}} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{{{SCHED}}} 0.0
# TYPE sglang:weight_memory_usage_gb gauge
sglang:weight_memory_usage_gb{{{SCHED}}} 62.5
# TYPE sglang:kv_cache_memory_usage_gb gauge
sglang:kv_cache_memory_usage_gb{{{SCHED}}} 40.0
# TYPE sglang:graph_memory_usage_gb gauge
sglang:graph_memory_usage_gb{{{SCHED}}} 2.0
# HELP sglang:num_transfer_failed_reqs_total The number of transfer failed requests.
# TYPE sglang:num_transfer_failed_reqs_total counter
# TYPE sglang:startup_time_seconds gauge
sglang:startup_time_seconds{{model_name="standin",engine_type="prefill",phase="tokenizer_e2e"}} 5.2
"""


def failed_transfers(n: int) -> str:
    return f"sglang:num_transfer_failed_reqs_total{{{SCHED}}} {float(n)}\n"


# The real smg 1.13.0's listener just after /readiness turned 200 (tests/fixtures/smg_exposition.py).
ROUTER_READY = recorded("ready")
ROUTED = ('smg_router_requests_total{router_type="http",backend_type="pd",connection_mode="http",model="standin",'
          'endpoint="chat",streaming="%s"} %d\n')
CHAT_HTTP = 'smg_http_requests_total{method="POST",path="/v1/chat/completions"} %d\n'


def router_after(non_streaming: int, streaming: int) -> str:
    return (ROUTER_READY + "# TYPE smg_router_requests_total counter\n" + ROUTED % ("true", streaming) +
            ROUTED % ("false", non_streaming) + CHAT_HTTP % (streaming + non_streaming))


def obs(text: str, role: str = "router"):
    return probe.parse(f"http://127.0.0.1/{role}/metrics", text)


# ---- the parser and the bounded reader
def test_parse_reads_labels_escapes_histograms_and_timestamps():
    text = ('# TYPE x counter\nx{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 3 1700000000000\n'
            'h_bucket{le="+Inf"} 4\nnan_gauge NaN\nplain 1.5e3\n')
    o = obs(text)
    assert o.bad_lines == 0 and o.declared == {"x": "counter"}
    (x,) = o.series("x")
    assert dict(x.labels) == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"} and x.value == 3
    assert o.series("h")[0].value == 4 and probe.total(o, "plain") == 1500.0
    assert probe.total(o, "nan_gauge") is None  # a NaN series is no reading


def test_parse_counts_bad_lines_and_keeps_the_rest():
    o = obs('good 1\nbroken{a="1" 2\nno_value\nalso{a="x"} notanumber\nafter{a="y"} 7\n')
    assert o.bad_lines == 3 and o.bad_examples[0].startswith("broken")
    assert probe.total(o, "good") == 1 and probe.total(o, "after", a="y") == 7


def test_total_sums_matching_series_and_is_none_without_any():
    o = obs(router_after(3, 2))
    assert probe.total(o, "smg_router_requests_total") == 5
    assert probe.total(o, "smg_router_requests_total", streaming="true") == 2
    assert probe.total(o, "smg_http_requests_total", path="/v1/chat/completions") == 5
    assert probe.total(obs(ROUTER_READY), "smg_router_requests_total") is None


def _client(handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler), timeout=1)


def test_read_is_bounded_in_size():
    with _client(lambda request: httpx.Response(200, content=b"x 1\n" * 1000)) as client:
        big = probe.read(client, "http://w/metrics", timeout=5, max_bytes=1000)
        fine = probe.read(client, "http://w/metrics", timeout=5, max_bytes=100_000)
    assert big.status is None and "larger than 1000 bytes" in big.error
    assert fine.ok and len(fine.samples) == 1000


class _Trickle(httpx.SyncByteStream):
    def __iter__(self):
        for _ in range(50):
            time.sleep(0.02)
            yield b"x 1\n"


def test_read_is_bounded_in_time_even_when_bytes_keep_coming():
    with _client(lambda request: httpx.Response(200, stream=_Trickle())) as client:
        slow = probe.read(client, "http://w/metrics", timeout=0.2)
    assert slow.status is None and "not complete within 0.2 s" in slow.error


def test_read_reports_no_answer_and_http_errors():
    def refuse(request):
        raise httpx.ConnectError("Connection refused", request=request)

    with _client(refuse) as client:
        down = probe.read(client, "http://w/metrics", timeout=1)
    with _client(lambda request: httpx.Response(404, json={"detail": "Not Found"})) as client:
        missing = probe.read(client, "http://w/metrics", timeout=1)
    assert down.status is None and "Connection refused" in down.describe()
    assert missing.status == 404 and not missing.ok


def test_expectations_name_each_roles_metrics_url():
    router = DEP.router
    assert EXP.metrics_urls == {
        "prefill": f"{EXP.workers['prefill'].url}/metrics", "decode": f"{EXP.workers['decode'].url}/metrics",
        "router": f"http://{router.prometheus_host}:{router.prometheus_port}/metrics"}


# ---- metrics.<role>
def test_endpoint_passes_with_every_family_an_idle_server_has():
    assert metrics.check_endpoint(EXP, "prefill", obs(PREFILL_IDLE, "prefill")).status == "pass"
    assert metrics.check_endpoint(EXP, "router", obs(ROUTER_READY)).status == "pass"


def test_endpoint_fails_on_a_missing_family_and_says_a_declaration_is_not_a_series():
    text = PREFILL_IDLE.replace(f"sglang:token_usage{{{SCHED}}} 0.0\n", "")
    result = metrics.check_endpoint(EXP, "prefill", obs(text, "prefill"))
    assert result.status == "fail" and "missing: sglang:token_usage" in result.observed
    assert "sglang:token_usage: declared (gauge) but no series" in result.details
    assert "versions.prefill" in result.remediation
    router = metrics.check_endpoint(EXP, "router", obs(PREFILL_IDLE))
    assert router.status == "fail" and "smg_worker_health" in router.observed


def test_endpoint_that_does_not_answer_names_the_flag_or_the_listener():
    down = probe.MetricsObs("http://127.0.0.1:29000/metrics", None, error="ConnectError: refused")
    router = metrics.check_endpoint(EXP, "router", down)
    assert router.status == "fail" and "no answer" in router.observed and "prometheus_port" in router.remediation
    worker = metrics.check_endpoint(EXP, "decode", probe.MetricsObs("http://127.0.0.1:30002/metrics", 404))
    assert worker.status == "fail" and "--enable-metrics" in worker.remediation


# ---- metrics.kv_transfer
def _pair(before: str, after: str):
    return obs(before, "prefill"), obs(after, "prefill")


def test_transfer_counter_absent_before_and_after_is_no_failure_and_says_so():
    idle = _pair(PREFILL_IDLE, PREFILL_IDLE)
    result = metrics.check_transfer_failures(EXP, {"prefill": idle, "decode": idle}, 4)
    assert result.status == "pass" and result.observed.count("no series before or after") == 2


def test_transfer_counter_that_appears_or_grows_fails():
    first = metrics.check_transfer_failures(
        EXP, {"prefill": _pair(PREFILL_IDLE, PREFILL_IDLE),
              "decode": _pair(PREFILL_IDLE, PREFILL_IDLE + failed_transfers(3))}, 4)
    assert first.status == "fail" and "decode: 0 -> 3" in first.observed and "decode +3" in first.remediation
    grew = metrics.check_transfer_failures(
        EXP, {"prefill": _pair(PREFILL_IDLE + failed_transfers(2), PREFILL_IDLE + failed_transfers(5)),
              "decode": _pair(PREFILL_IDLE, PREFILL_IDLE)}, 4)
    assert grew.status == "fail" and "prefill +3" in grew.remediation


def test_transfer_counter_that_stayed_passes_and_one_that_went_back_warns():
    old = PREFILL_IDLE + failed_transfers(7)
    idle = _pair(PREFILL_IDLE, PREFILL_IDLE)
    stayed = metrics.check_transfer_failures(EXP, {"prefill": _pair(old, old), "decode": idle}, 4)
    assert stayed.status == "pass" and "prefill: 7 -> 7" in stayed.observed
    restarted = metrics.check_transfer_failures(EXP, {"prefill": _pair(old, PREFILL_IDLE), "decode": idle}, 4)
    assert restarted.status == "warn" and "restarted" in restarted.remediation


def test_transfer_check_skips_without_requests_and_fails_without_a_reading():
    assert metrics.check_transfer_failures(EXP, {}, 0).status == "skip"
    down = probe.MetricsObs("http://127.0.0.1:30002/metrics", None, error="ConnectError: refused")
    unread = metrics.check_transfer_failures(
        EXP, {"prefill": _pair(PREFILL_IDLE, PREFILL_IDLE), "decode": (None, down)}, 4)
    assert unread.status == "fail" and "decode before: not read" in unread.observed
    assert "decode after: http://127.0.0.1:30002/metrics: no answer" in unread.observed


# ---- metrics.router_requests
def test_router_counted_the_requests_it_was_sent():
    result = metrics.check_router_requests(EXP, obs(ROUTER_READY), obs(router_after(3, 1)), 4)
    assert result.status == "pass" and "0 -> 4 (+4) for 4 requests sent" in result.observed
    assert 'smg_http_requests_total{path="/v1/chat/completions"} 0 -> 4' in result.details
    more = metrics.check_router_requests(EXP, obs(router_after(1, 1)), obs(router_after(5, 3)), 4)
    assert more.status == "pass"  # the router's retries and other clients only add


def test_router_that_counted_fewer_fails_and_one_that_restarted_warns():
    frozen = metrics.check_router_requests(EXP, obs(router_after(3, 1)), obs(router_after(3, 1)), 4)
    assert frozen.status == "fail" and "(+0)" in frozen.observed and "prometheus_port" in frozen.remediation
    short = metrics.check_router_requests(EXP, obs(ROUTER_READY), obs(router_after(2, 0)), 4)
    assert short.status == "fail"
    restarted = metrics.check_router_requests(EXP, obs(router_after(3, 1)), obs(ROUTER_READY), 4)
    assert restarted.status == "warn" and "restarted" in restarted.remediation


def test_router_count_skips_without_requests_and_fails_without_a_reading():
    assert metrics.check_router_requests(EXP, None, None, 0).status == "skip"
    result = metrics.check_router_requests(EXP, None, obs(router_after(1, 1)), 2)
    assert result.status == "fail" and "router before: not read" in result.observed


# ---- the baseline: read once, before the first end-to-end request, only when a check compares with it
@pytest.fixture
def counting_context():
    seen: list[str] = []

    def handler(request):
        seen.append(str(request.url))
        return httpx.Response(200, text=ROUTER_READY)

    ctx = runner.Context(DEP, EXP, runner.Options(probe_timeout=1),
                         httpx.Client(transport=httpx.MockTransport(handler)))
    return ctx, seen


def test_the_baseline_is_read_once_before_the_first_request(counting_context):
    ctx, seen = counting_context
    ctx.wants_metrics_baseline = True
    for _ in range(3):
        ctx.before_e2e_request()
    assert ctx.e2e_requests == 3 and sorted(seen) == sorted(EXP.metrics_urls.values())
    assert set(ctx.metrics_baseline) == {"prefill", "decode", "router"}


def test_the_runner_asks_for_a_baseline_only_when_a_comparing_check_is_selected(counting_context):
    ctx, seen = counting_context
    sent = {"e2e.chat": lambda c: (c.before_e2e_request(), metrics.check_router_requests(EXP, None, None, 0))[1]}
    plan = runner.select(list(CHECKS), ["e2e.chat"], [])
    runner.run(ctx, plan, checks={**CHECKS, **sent})
    assert ctx.e2e_requests == 1 and seen == [] and ctx.metrics_baseline is None
    plan = runner.select(list(CHECKS), ["e2e.chat", "metrics.router_requests"], [])
    runner.run(ctx, plan, checks={**CHECKS, **sent})
    assert ctx.metrics_baseline is not None and "router" in ctx.metrics_baseline


def test_the_comparing_checks_run_after_every_end_to_end_check():
    """The runner keeps the registry's order: a comparison before a request would count nothing."""
    ids = list(CHECKS)
    last_e2e = max(ids.index(i) for i in ids if i.startswith("e2e."))
    assert all(ids.index(i) > last_e2e for i in runner.BEFORE_AND_AFTER_E2E if i in ids)
    assert runner.BEFORE_AND_AFTER_E2E <= set(ids)
