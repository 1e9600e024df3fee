"""`pdserve verify`, `pdserve wait-ready` and the readiness gate against misbehaving servers: the deadlines
hold, an odd answer fails its check with observed and expected (exit 1, never 3), and the report, table and
--json, survives any bytes a server sends."""

from __future__ import annotations

import json
import time
import tomllib
from contextlib import ExitStack

import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.launch.gate import LAST_PROBE_S, router_observation, worker_observation
from pdserve.probes import http
from pdserve.schema.loading import default_profile_text
from tests.fixtures import misbehaving_server as ms

SLACK = 0.7  # thread wake-ups, click's runner, the report, on two busy cores


def _deployment(tmp_path, ports: dict[str, int]):
    data = tomllib.loads(default_profile_text())
    for role, port in ports.items():
        data[role]["port"] = port
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(data))
    return path


def _strict_json(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    data = json.loads(text, parse_constant=refuse)
    json.dumps(data, ensure_ascii=False).encode("utf-8")  # no lone surrogate survives into the report
    return data


def _verify(tmp_path, routes: dict[str, dict], *args: str):
    """Run `pdserve verify` with each role served by a misbehaving server; (result, seconds, servers)."""
    with ExitStack() as stack:
        servers = {role: stack.enter_context(ms.serving(r)) for role, r in routes.items()}
        config = _deployment(tmp_path, {role: s.port for role, s in servers.items()})
        began = time.monotonic()
        result = CliRunner().invoke(main, ["verify", "-c", str(config), *args])
        return result, time.monotonic() - began, servers


WRONG_TYPES = {
    "router": {"/readiness": ms.answer(200, {"healthy_workers": "2", "total_workers": 2}),
               "/workers": ms.answer(200, {"workers": 5}), "/health": ms.answer(200, b"")},
    "prefill": {"/health": ms.answer(200, b""), "/server_info": ms.answer(200, {
        "max_total_num_tokens": True, "tp_size": [4], "mem_fraction_static": "0.8", "version": {"v": 1}}),
        "/model_info": ms.answer(200, {"disaggregation_mode": 5})},
    "decode": {"/health": ms.answer(200, b""), "/server_info": ms.answer(
        200, '{"max_total_num_tokens": ' + ms.HUGE_INT + ', "mem_fraction_static": ' + ms.HUGE_INT + "}"),
        "/model_info": ms.answer(200, ms.DEEP)},
}
CHECKS = "router.readiness,router.workers,kv.prefill,kv.decode,server.prefill,server.decode,versions.prefill"


def test_wrong_types_fail_their_checks_with_observed_and_expected(tmp_path):
    result, _, _ = _verify(tmp_path, WRONG_TYPES, "--only", CHECKS, "--json", "--probe-timeout", "2")
    assert result.exit_code == 1, result.output
    report = _strict_json(result.output)
    assert report["verifier_errors"] == []
    checks = {c["id"]: c for c in report["checks"] if not c["observed"].startswith("skipped: not selected")}
    assert all(c["status"] == "fail" for c in checks.values()), checks
    assert "healthy_workers = '2' (a string)" in checks["router.readiness"]["observed"]
    assert "healthy_workers: an integer" in checks["router.readiness"]["expected"]
    assert "workers = 5 (an integer)" in checks["router.workers"]["observed"]
    assert "workers: a list" in checks["router.workers"]["expected"]
    assert "max_total_num_tokens = True (a boolean)" in checks["kv.prefill"]["observed"]
    assert "an integer of 400 digits" in checks["kv.decode"]["observed"]
    assert "tp_size = [4] (a list)" in checks["server.prefill"]["observed"]
    assert "an integer of 400 digits" in checks["server.decode"]["observed"]
    assert "version = {'v': 1} (an object)" in checks["versions.prefill"]["observed"]


HOSTILE_TEXT = "\ud800 \udfff NUL\x00 ESC\x1b[2J BEL\x07 C1\x85 [bold]markup[/] [/] RTL\u202e"


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_any_bytes_a_server_sends_leave_the_report_whole(tmp_path, as_json):
    text = json.dumps(HOSTILE_TEXT)  # JSON escapes: \ud800 is a lone surrogate once parsed
    routes = {
        "router": {"/readiness": ms.answer(503, '{"status": "x", "reason": ' + text + "}"),
                   "/workers": ms.answer(200, b'{"workers": [{"url": "\xff\xfe"}]}')},
        "prefill": {"/health": ms.answer(200, b""), "/server_info": ms.answer(200, '{"version": ' + text + "}"),
                    "/model_info": ms.answer(200, {})},
        "decode": {"*": ms.answer(500, b"\x00\xff\xfe\x1b[31m<html>" + HOSTILE_TEXT.encode("utf-8", "surrogatepass"))},
    }
    args = ["--only", "router,versions,server", "--probe-timeout", "2"] + (["--json"] if as_json else [])
    result, _, _ = _verify(tmp_path, routes, *args)
    assert result.exit_code == 1, result.output
    assert "\x1b" not in result.output and "\x00" not in result.output and "\u202e" not in result.output
    if as_json:
        report = _strict_json(result.output)
        version = next(c for c in report["checks"] if c["id"] == "versions.prefill")
        assert "\\ud800 \\udfff NUL\\x00 ESC\\x1b[2J" in version["observed"]
    else:
        assert "FAILED:" in result.output and "[bold]markup[/]" in result.output


def test_verify_keeps_its_probe_timeout_against_a_dripping_router(tmp_path):
    drip = {"*": ms.slow_body}
    result, took, _ = _verify(tmp_path, {"router": drip, "prefill": drip, "decode": drip},
                              "--only", "router.readiness", "--probe-timeout", "1", "--json")
    # router.readiness reads the router's /readiness and each worker's /health: three requests of 1 s each.
    assert took <= 3 * 1 + SLACK, f"took {took:.2f} s"
    assert result.exit_code == 1
    check = next(c for c in _strict_json(result.output)["checks"] if c["id"] == "router.readiness")
    assert "no complete answer within 1 s" in check["observed"]


def test_verify_fails_a_redirecting_router_and_asks_nobody_else(tmp_path):
    with ms.serving({"*": ms.answer(200, {"healthy_workers": 2, "total_workers": 2})}) as elsewhere:
        routes = {"router": {"*": ms.redirect(308, f"{elsewhere.url}/v1/chat/completions")}}
        result, _, _ = _verify(tmp_path, routes, "--only", "router.readiness,e2e.chat", "--json",
                               "--probe-timeout", "2", "--chat-timeout", "2")
    assert elsewhere.requests == []
    assert result.exit_code == 1, result.output
    checks = {c["id"]: c for c in _strict_json(result.output)["checks"]}
    assert f"a redirect to '{elsewhere.url}/v1/chat/completions'" in checks["router.readiness"]["observed"]
    assert f"a redirect to '{elsewhere.url}/v1/chat/completions'" in checks["e2e.chat"]["observed"]


def test_verify_keeps_its_chat_timeout_against_an_endless_stream(tmp_path):
    routes = {"router": {"/v1/chat/completions": ms.endless_stream}}
    result, took, _ = _verify(tmp_path, routes, "--only", "e2e.stream", "--chat-timeout", "1", "--json")
    assert took <= 1 + SLACK + 0.5, f"took {took:.2f} s"  # + the openai client's import
    check = next(c for c in _strict_json(result.output)["checks"] if c["id"] == "e2e.stream")
    assert result.exit_code == 1 and "no complete answer within 1 s" in check["observed"]


@pytest.mark.parametrize(("behaviour", "timeout"), [(ms.slow_headers, 3), (ms.slow_body, 1), (ms.endless_body, 1)],
                         ids=["slow headers", "slow body", "endless body"])
def test_wait_ready_ends_within_its_timeout_whatever_the_server_does(tmp_path, behaviour, timeout):
    with ms.serving({"*": behaviour}) as server:
        config = _deployment(tmp_path, {"decode": server.port})
        began = time.monotonic()
        # --probe-timeout 10 is longer than the whole wait: the wait's deadline must cut the request.
        result = CliRunner().invoke(main, ["wait-ready", "decode", "-c", str(config), "--timeout", str(timeout),
                                           "--interval", "0.5", "--probe-timeout", "10"])
        took = time.monotonic() - began
    assert took <= timeout + LAST_PROBE_S + SLACK, f"took {took:.2f} s"
    assert result.exit_code == 1
    assert f"not ready after {timeout} s; last state: " in result.output
    assert "no complete answer within" in result.output


@pytest.mark.parametrize(("routes", "state"), [
    ({"/health": ms.answer(200, b""), "/model_info": ms.answer(200, {"disaggregation_mode": ["decode"]})},
     "disaggregation_mode=['decode'] (a list), expected decode"),
    ({"/health": ms.answer(200, b""), "/model_info": ms.answer(200, [1])}, "with [1] (a list), expected a JSON object"),
    ({"/health": ms.answer(200, b""), "/model_info": ms.answer(200, ms.DEEP)}, "nested deeper than 32 levels"),
    ({"/health": ms.redirect(307, "http://127.0.0.1:9/health")}, "a redirect to 'http://127.0.0.1:9/health'"),
    ({"/health": ms.gzip_bomb(64 * 1024 * 1024)}, "answer larger than"),
], ids=["list mode", "list body", "deep", "redirect", "bomb"])
def test_the_worker_gate_is_not_ready_naming_what_came(routes, state):
    with ms.serving(routes) as server, http.client(2) as client:
        seen = worker_observation(client, server.url, "decode")
    assert not seen.ready and state in seen.state, seen.state


@pytest.mark.parametrize(("body", "state"), [
    ({"healthy_workers": 2.0, "total_workers": 2}, "healthy_workers = 2.0 (a number)"),
    ({"healthy_workers": 2, "total_workers": -1}, "total_workers = -1 (an integer)"),
    ([2, 2], "/readiness = [2, 2] (a list)"),
], ids=["float count", "negative count", "list"])
def test_the_router_gate_is_not_ready_on_wrong_types(body, state):
    with ms.serving({"/readiness": ms.answer(200, body)}) as server, http.client(2) as client:
        seen = router_observation(client, server.url, 2)
    assert not seen.ready and state in seen.state, seen.state


def test_printable_escapes_what_a_terminal_or_a_json_parser_would_take_badly():
    from pdserve.verify.printable import printable

    assert printable(HOSTILE_TEXT) == ("\\ud800 \\udfff NUL\\x00 ESC\\x1b[2J BEL\\x07 C1\\x85 [bold]markup[/] [/] "
                                       "RTL\\u202e")
    assert printable("line\n\ttab é ｜DSML｜") == "line\n\ttab é ｜DSML｜"  # printable text is left as it is
    assert printable("x" * 50, limit=10) == "xxxxxxxxxx... (40 more characters)"


@pytest.mark.parametrize(("behaviour", "observed"), [
    (ms.slow_body, "no complete answer within 1 s"),
    (ms.gzip_bomb(64 * 1024 * 1024), "answer larger than"),
    (ms.answer(200, b"\x00\xff\xfe garbage {\n" * 1000, {"Content-Type": "text/plain"}), "missing: "),
    (ms.answer(200, {"sglang:num_running_reqs": [1]}), "missing: "),
], ids=["drip", "bomb", "binary", "json"])
def test_metrics_endpoints_fail_their_check_on_any_answer(tmp_path, behaviour, observed):
    result, took, _ = _verify(tmp_path, {"decode": {"/metrics": behaviour}}, "--only", "metrics.decode", "--json",
                              "--probe-timeout", "1")
    assert took <= 1 + SLACK + 0.5
    assert result.exit_code == 1, result.output
    check = next(c for c in _strict_json(result.output)["checks"] if c["id"] == "metrics.decode")
    assert check["status"] == "fail" and observed in check["observed"], check
