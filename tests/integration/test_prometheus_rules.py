"""The rendered monitoring files against Debian's promtool: `check config`, `check rules`, and `test rules`
with input series, generated from the same deployment, that make every alert fire and others that keep
each one silent (a rule that can never fire, or always does, fails here). The router's input series carry
the names and labels the real smg 1.13.0 exposed (tests/fixtures/recorded/, by tests/fixtures/smg_exposition.py).

Needs promtool (Debian's `prometheus` package); CI installs it and sets PDSERVE_REQUIRE_PROMETHEUS=1.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pdserve.render.emit import prometheus
from pdserve.render.monitoring import ALERTS_FILE, PROMETHEUS_FILE, monitoring_files
from pdserve.render.monitoring import metrics as m
from pdserve.render.monitoring.alerts import Alert, alerts
from pdserve.render.monitoring.targets import Target, targets
from pdserve.schema.config import Deployment
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.placement import role_url
from tests.conftest import require_or_skip
from tests.fixtures.smg_exposition import PHASES, recorded

pytestmark = pytest.mark.integration
PROMTOOL_TIMEOUT = 60


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    require_or_skip(found is not None, "promtool not installed (apt-get install prometheus)",
                    "PDSERVE_REQUIRE_PROMETHEUS")
    return found


def _deployment(reference_data: dict, **monitoring) -> Deployment:
    reference_data["monitoring"] = {"enable": True, **monitoring}
    return deployment_from_data(reference_data, "<test>").deployment


@pytest.fixture(params=["pd", "single"], ids=["boot-pd", "boot-single"])
def dep(request, reference_data) -> Deployment:
    reference_data["boot_layout"] = request.param
    # Thresholds away from the defaults, so a rule that ignored the deployment's would be caught.
    return _deployment(reference_data, ttft_p99_seconds=7.5, kv_usage_threshold=0.8, queue_max_requests=5)


def _written(dep: Deployment, directory: Path) -> Path:
    for name, text in monitoring_files(dep).items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT)


def test_promtool_checks_config_and_rules(promtool, dep, tmp_path):
    out = _written(dep, tmp_path)
    config = _run([promtool, "check", "config", PROMETHEUS_FILE], out)
    assert config.returncode == 0, config.stdout + config.stderr
    rules = _run([promtool, "check", "rules", ALERTS_FILE], out)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(alerts(dep))} rules found" in rules.stdout


# ---- promtool test rules: one scenario per alert and outcome, built from the deployment's targets


@dataclass
class Scenario:
    alert: str
    fires: bool
    why: str
    series: dict[str, str]  # series selector -> promtool values notation, `interval` apart
    eval_minutes: int
    labels: list[dict[str, str]] = field(default_factory=list)  # the firing alerts' labels beyond the rule's
    interval: str = "1m"  # rules over 1m windows need samples closer than that, as a 15 s scrape gives


def _recorded_router_samples():
    """The real router's samples, every phase (each a (name, labels) pair)."""
    from pdserve.probes.metrics import parse

    return [(sample.name, dict(sample.labels)) for phase in PHASES for sample in parse("rec", recorded(phase)).samples]


ROUTER_SAMPLES = _recorded_router_samples()


def _selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(prometheus.matcher(k, v) for k, v in labels.items()) + "}"


class Series:
    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.by_role: dict[str, Target] = {t.role: t for t in targets(dep)}

    def target_labels(self, role: str) -> dict[str, str]:
        t = self.by_role[role]
        return {"job": t.job, "instance": t.address, **t.labels(self.dep)}

    def of(self, metric: str, role: str, **extra: str) -> tuple[str, dict[str, str]]:
        labels = {**self.target_labels(role), **extra}
        return _selector(metric, labels), labels

    def router(self, metric: str, **match: str) -> tuple[str, dict[str, str]]:
        """A router series as the real smg exposed it: the labels of a recorded sample of `metric` that
        matches `match`, its worker URL made this deployment's."""
        for name, labels in ROUTER_SAMPLES:
            if name == metric and all(labels.get(k) == v for k, v in match.items()):
                if "worker" in labels:
                    labels = {**labels, "worker": role_url(self.dep, "prefill")}
                return self.of(metric, "router", **labels)
        raise AssertionError(f"smg never exposed {metric} with {match}")

    def sglang(self, metric: str, role: str, scheduler: bool = True, **extra: str) -> tuple[str, dict[str, str]]:
        engine = {"fallback": "unified"}.get(role, role)
        base = {"model_name": "m", "engine_type": engine}
        if scheduler:
            base.update(tp_rank="0", pp_rank="0", moe_ep_rank="0")
        return self.of(metric, role, **base, **extra)


def scenarios(dep: Deployment) -> list[Scenario]:
    s = Series(dep)
    mon = dep.monitoring
    found: list[Scenario] = []
    name = dep.name

    def roles_up(*roles: str, values: str = "1x20") -> dict[str, str]:
        return {s.of("up", r)[0]: values for r in roles}

    def group(labels: dict[str, str], *keys: str) -> dict[str, str]:
        return {k: labels[k] for k in keys}

    def one_role_gauge(alert: str, metric: str, role: str, eval_minutes: int,
                       fires: dict[str, str], silent: dict[str, str]) -> list[Scenario]:
        """The cases of a rule over one SGLang gauge of one role, aggregated by (deployment, role): each case
        (why -> the gauge's values) evaluated at the same minute; a firing one raises that role's one alert."""
        gauge, labels = s.sglang(metric, role)
        raised = [group(labels, "deployment", "role")]
        return ([Scenario(alert, True, why, {gauge: values}, eval_minutes, raised) for why, values in fires.items()]
                + [Scenario(alert, False, why, {gauge: values}, eval_minutes) for why, values in silent.items()])

    # A PD role down, with and without the fallback serving in its place.
    prefill_up, prefill_labels = s.of("up", "prefill")
    found += [
        Scenario("PdserveTargetDown", True, "the prefill stops answering",
                 {**roles_up("decode", "router"), prefill_up: "1x4 0x16"}, 10, [prefill_labels]),
        Scenario("PdserveTargetDown", False, "every PD role answers", roles_up("prefill", "decode", "router"), 10),
        Scenario("PdserveTargetDown", False, "cut over to the fallback, which serves",
                 {**roles_up("fallback"), **roles_up("prefill", "decode", "router", values="1x4 0x16")}, 10),
    ]
    if dep.boot_layout == "single":
        fallback_up, fallback_labels = s.of("up", "fallback")
        found += [
            Scenario("PdserveFallbackDown", True, "the fallback stops answering, no router serves",
                     {fallback_up: "1x4 0x16"}, 10, [fallback_labels]),
            Scenario("PdserveFallbackDown", False, "cut over to PD: the router serves",
                     {fallback_up: "1x4 0x16", **roles_up("router")}, 10),
        ]
    # The router's own count of healthy workers.
    router_up = roles_up("router")
    health = [s.of(m.ROUTER_WORKER_HEALTH, "router", worker=f"http://127.0.0.1:{p}")[0] for p in (1, 2)]
    found += [
        Scenario("PdserveRouterWorkersUnhealthy", True, "the router marks one worker unhealthy",
                 {**router_up, health[0]: "1x20", health[1]: "1x4 0x16"}, 10, [{"deployment": name}]),
        Scenario("PdserveRouterWorkersUnhealthy", True, "the router registered no worker at all",
                 router_up, 10, [{}]),
        Scenario("PdserveRouterWorkersUnhealthy", False, "both workers healthy",
                 {**router_up, health[0]: "1x20", health[1]: "1x20"}, 10),
    ]
    # The router refusing: 503 no_available_workers for over 2 minutes, its series created by the first.
    refused, _ = s.router(m.ROUTER_HTTP_RESPONSES, error_code=m.NO_WORKERS)
    not_ready, _ = s.router(m.ROUTER_HTTP_RESPONSES, path="/readiness", status_code="503")
    exhausted, _ = s.router("smg_worker_retries_exhausted_total", worker_type="prefill", endpoint="chat")
    found += [
        Scenario("PdserveRouterRefusing", True, "refusals go on for minutes (retries exhausted stays 0)",
                 {refused: "_x8 5+3x40", exhausted: "0x48"}, 6, [{"deployment": name}], "15s"),
        Scenario("PdserveRouterRefusing", False, "a restart's minute of refusals, then served again",
                 {refused: "_x8 5+3x4 17x36"}, 6, interval="15s"),
        Scenario("PdserveRouterRefusing", False, "503 on /readiness only (not ready yet), no request refused",
                 {not_ready: "0+1x48"}, 6, interval="15s"),
    ]
    # A bootstrap port the router's registration probe found closed: counted once, at the router's start.
    probe_failed, probe_labels = s.router(m.PD_RENDEZVOUS_FAILURES, phase=m.BOOTSTRAP_PROBE)
    found += [
        Scenario("PdserveRouterBootstrapRefused", True, "the router started with the prefill's port closed",
                 {probe_failed: "_x2 1x20"}, 10, [group(probe_labels, "deployment", "leg")]),
        Scenario("PdserveRouterBootstrapRefused", False, "the refusal is older than 30 minutes",
                 {probe_failed: "1x50"}, 45),
    ]
    # Breakers: every transition exists from the router's start at 0.
    opened, opened_labels = s.router(m.BREAKER_TRANSITIONS, to=m.BREAKER_OPEN, **{"from": "closed"})
    closed, _ = s.router(m.BREAKER_TRANSITIONS, to="closed", **{"from": "half_open"})
    found += [
        Scenario("PdserveRouterBreakerOpened", True, "a breaker opened",
                 {opened: "0x5 1x10", closed: "0x15"}, 8, [group(opened_labels, "deployment", "worker")]),
        Scenario("PdserveRouterBreakerOpened", False, "only closing transitions",
                 {opened: "0x20", closed: "0x5 1x15"}, 8),
        Scenario("PdserveRouterBreakerOpened", False, "it opened long ago", {opened: "0x2 1x30"}, 20),
    ]
    # KV transfer failures on the decode: a rising counter, and a counter's first series.
    failed, failed_labels = s.sglang(m.TRANSFER_FAILED, "decode")
    by_role = group(failed_labels, "deployment", "role")
    found += [
        Scenario("PdserveKVTransferFailures", True, "the failure counter rises", {failed: "2x5 3x5"}, 7, [by_role]),
        Scenario("PdserveKVTransferFailures", True, "the first failure creates the counter",
                 {failed: "_x6 1x4"}, 8, [by_role]),
        Scenario("PdserveKVTransferFailures", False, "old failures, none new", {failed: "3x20"}, 10),
    ]
    found += one_role_gauge("PdserveKVCacheFull", m.TOKEN_USAGE, "decode", 10, fires={
        "usage above the threshold for 5 minutes": f"{(mon.kv_usage_threshold + 1) / 2:g}x20",
    }, silent={
        "usage below the threshold": f"{mon.kv_usage_threshold * 0.9:g}x20",
    })
    found += one_role_gauge("PdserveQueueGrowing", m.QUEUED, "prefill", 15, fires={
        "a long queue that keeps growing": f"{mon.queue_max_requests + 1}+1x20",
    }, silent={
        "a long queue that does not grow": f"{mon.queue_max_requests + 10}x20",
        "a growing queue below the bound": f"0+{max(mon.queue_max_requests, 1) / 40:g}x20",
    })
    # TTFT: every observation in one histogram bucket, just above or well below the bound.
    bound = mon.ttft_p99_seconds

    def buckets(selector, slow: bool) -> dict[str, str]:
        """selector(le) -> series; every observation just above the bound (slow) or well below it."""
        return {selector(le): "0x30" if slow and le == f"{bound / 2:g}" else "0+10x30"
                for le in (f"{bound / 2:g}", f"{bound * 2:g}", "+Inf")}

    def router_ttft(slow: bool) -> dict[str, str]:
        (_, labels) = s.router(f"{m.PD_TTFT}_bucket")
        return buckets(lambda le: _selector(f"{m.PD_TTFT}_bucket", {**labels, "le": le}), slow)

    def sglang_ttft(role: str, slow: bool) -> dict[str, str]:
        return buckets(lambda le: s.sglang(f"{m.TTFT}_bucket", role, scheduler=False, is_streaming="false",
                                           le=le)[0], slow)

    found += [
        Scenario("PdserveTTFTHigh", True, "the router's PD p99 above the bound for 10 minutes", router_ttft(True),
                 20, [{"deployment": name, "role": "router"}]),
        Scenario("PdserveTTFTHigh", True, "the fallback's p99 above the bound while it serves",
                 sglang_ttft("fallback", True), 20, [{"deployment": name, "role": "fallback"}]),
        Scenario("PdserveTTFTHigh", False, "the router's p99 below the bound", router_ttft(False), 20),
        Scenario("PdserveTTFTHigh", False, "one leg's own view (the decode's SGLang TTFT) is not the client's",
                 {**router_ttft(False), **sglang_ttft("decode", True)}, 20),
    ]
    start, start_labels = s.sglang(m.STARTUP_TIME, "prefill", scheduler=False, phase=m.STARTUP_PHASE)
    found += [
        Scenario("PdserveWorkerRestarted", True, "startup time set again (a new start)",
                 {start: "41.5x5 _x2 43.25x5"}, 10, [start_labels]),
        Scenario("PdserveWorkerRestarted", False, "one start only", {start: "41.5x20"}, 10),
    ]
    checks, checks_labels = s.of(m.ROUTER_HEALTH_CHECKS, "router", worker_type="decode", result="success")
    found += [
        Scenario("PdserveRouterRestarted", True, "the health-check counter starts again from zero",
                 {checks: "100+30x5 0+30x5"}, 10, [checks_labels]),
        Scenario("PdserveRouterRestarted", False, "the counter only grows", {checks: "100+30x20"}, 10),
    ]
    return found


_GO_STRING_ESCAPE = re.compile(r"\\(u[0-9a-f]{4}|U[0-9a-f]{8}|.)")


def _go_string(body: str) -> str:
    """The text of a Go string literal's body, as prometheus.promql_string escapes it."""
    def one(mt: re.Match) -> str:
        code = mt.group(1)
        return chr(int(code[1:], 16)) if code[0] in "uU" and len(code) > 1 else \
            {"n": "\n", "r": "\r", "t": "\t"}.get(code, code)
    return _GO_STRING_ESCAPE.sub(one, body)


def _annotations(rule: Alert, labels: dict[str, str]) -> dict[str, str]:
    def expand(text: str) -> str:
        # Template actions pdserve writes: a label, or a string literal (prometheus.template_text).
        return re.sub(r'\{\{ (?:\$labels\.(\w+)|"((?:[^"\\]|\\.)*)") \}\}',
                      lambda mt: labels.get(mt.group(1), "") if mt.group(1) else _go_string(mt.group(2)), text)

    return {"summary": expand(rule.summary), "description": expand(rule.description)}


def rule_tests(dep: Deployment) -> dict:
    rules = {a.name: a for a in alerts(dep)}
    tests = []
    for sc in scenarios(dep):
        rule = rules[sc.alert]
        expected = []
        for labels in sc.labels:
            full = {**labels, "severity": rule.severity, "deployment": dep.name}
            expected.append({"exp_labels": full, "exp_annotations": _annotations(rule, full)})
        tests.append({
            "name": f"{sc.alert} {'fires' if sc.fires else 'stays silent'}: {sc.why}",
            "interval": sc.interval,
            "input_series": [{"series": k, "values": v} for k, v in sc.series.items()],
            "alert_rule_test": [{"eval_time": f"{sc.eval_minutes}m", "alertname": sc.alert,
                                 "exp_alerts": expected}],
        })
    return {"rule_files": [ALERTS_FILE], "evaluation_interval": "1m", "tests": tests}


# Deployment names the schema refuses (lowercase, digits, dashes only), put in past it: the emitter alone must
# carry them into selectors, labels and templates. promtool's own parsers read them, and its rule tests
# select by them, so a value that leaked out of its quoting would fail a case or the files.
ODD_NAMES = ['quote " back\\slash', "{{ template }}", "}} {{ $labels.role", "line\nbreak, tab\t",
             "nel\x85 sep\u2028 del\x7f", "emoji \U0001f600", 'a",role="router', "by (x) (y)"]


@pytest.mark.parametrize("odd", ODD_NAMES)
def test_rules_hold_for_odd_names_and_hosts(promtool, reference_data, tmp_path, odd):
    """An IPv6 loopback router, a host name and IPv6 workers, the highest port: in targets, worker URLs and
    instance labels; the name in every selector, label and annotation."""
    reference_data["router"].update(prometheus_host="::1", host="localhost")
    reference_data["prefill"].update(host="::1", port=65535)
    reference_data["decode"].update(host="::1")
    dep = _deployment(reference_data, ttft_p99_seconds=7.5).model_copy(update={"name": odd})
    out = _written(dep, tmp_path)
    for argv in (["check", "config", PROMETHEUS_FILE], ["check", "rules", ALERTS_FILE]):
        done = _run([promtool, *argv], out)
        assert done.returncode == 0, (argv, done.stdout + done.stderr)
    (out / "rules_test.yml").write_text(prometheus.document(rule_tests(dep)), encoding="utf-8")
    result = _run([promtool, "test", "rules", "rules_test.yml"], out)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case(dep):
    cases = scenarios(dep)
    for alert in alerts(dep):
        outcomes = {sc.fires for sc in cases if sc.alert == alert.name}
        assert outcomes == {True, False}, f"{alert.name}: cases for {outcomes}"
    assert all(bool(sc.labels) == sc.fires for sc in cases)


def test_promtool_test_rules(promtool, dep, tmp_path):
    out = _written(dep, tmp_path)
    (out / "rules_test.yml").write_text(prometheus.document(rule_tests(dep)), encoding="utf-8")
    result = _run([promtool, "test", "rules", "rules_test.yml"], out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_promtool_fails_every_case_with_its_expectation_flipped(promtool, dep, tmp_path):
    """The rule tests can fail: expecting silence where a case fires (and an alert where it stays silent)
    fails every single case, so none of them passes whatever the rules say."""
    out = _written(dep, tmp_path)
    flipped = rule_tests(dep)
    for case in flipped["tests"]:
        check = case["alert_rule_test"][0]
        check["exp_alerts"] = [] if check["exp_alerts"] else [{"exp_labels": {"severity": "critical"}}]
    (out / "rules_test.yml").write_text(prometheus.document(flipped), encoding="utf-8")
    result = _run([promtool, "test", "rules", "rules_test.yml"], out)
    assert result.returncode != 0
    failed = re.findall(r"^\s+name: (.+),$", result.stdout + result.stderr, re.MULTILINE)
    assert sorted(failed) == sorted(case["name"] for case in flipped["tests"])
