"""What counts as ready, and the bounded wait for it."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import httpx
import pytest
from click.testing import CliRunner

from pdserve.cli.main import main
from pdserve.launch.gate import Observation, router_observation, wait_until_ready, worker_observation
from tests.fixtures.json_http import JsonHandler


def client_for(routes: dict[str, tuple[int, object]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        status, body = routes.get(request.url.path, (404, {"detail": "not found"}))
        return httpx.Response(status, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_worker_ready_needs_health_and_the_expected_mode():
    ok = client_for({"/health": (200, {}), "/model_info": (200, {"disaggregation_mode": "prefill"})})
    assert worker_observation(ok, "http://w", "prefill").ready
    wrong = client_for({"/health": (200, {}), "/model_info": (200, {"disaggregation_mode": "decode"})})
    observation = worker_observation(wrong, "http://w", "prefill")
    assert not observation.ready
    assert "disaggregation_mode=decode, expected prefill" in observation.state
    starting = client_for({"/health": (503, {})})
    assert "answered 503" in worker_observation(starting, "http://w", "prefill").state


def test_mode_from_server_info_when_model_info_lacks_it():
    """SGLang 0.5.17's /model_info has no disaggregation_mode (seen on H200 with the GPU tier); the gate
    reads /server_info then, and still tells a decode server from a prefill one."""
    model_info_0517 = {"model_path": "/m", "is_generation": True, "model_type": "llama"}
    ok = client_for({"/health": (200, {}), "/model_info": (200, model_info_0517),
                     "/server_info": (200, {"disaggregation_mode": "prefill", "tp_size": 1})})
    observation = worker_observation(ok, "http://w", "prefill")
    assert observation.ready and "disaggregation_mode=prefill" in observation.state
    wrong = client_for({"/health": (200, {}), "/model_info": (200, model_info_0517),
                        "/server_info": (200, {"disaggregation_mode": "decode"})})
    observation = worker_observation(wrong, "http://w", "prefill")
    assert not observation.ready and "/server_info reports disaggregation_mode=decode" in observation.state
    gone = client_for({"/health": (200, {}), "/model_info": (200, model_info_0517), "/server_info": (500, {})})
    assert "GET http://w/server_info answered 500" in worker_observation(gone, "http://w", "prefill").state


def test_fallback_expects_no_disaggregation():
    ok = client_for({"/health": (200, {}), "/model_info": (200, {"disaggregation_mode": "null"})})
    assert worker_observation(ok, "http://w", "null").ready


def test_router_ready_needs_every_worker_healthy():
    ready = client_for({"/readiness": (200, {"healthy_workers": 2, "total_workers": 2})})
    assert router_observation(ready, "http://r", 2).ready
    # The router keeps running with zero workers when they were late: /readiness says so.
    empty = client_for({"/readiness": (503, {"healthy_workers": 0, "total_workers": 0})})
    observation = router_observation(empty, "http://r", 2)
    assert not observation.ready and "0/0 workers healthy, expected 2" in observation.state


@pytest.mark.parametrize("reason", ["insufficient healthy workers", "draining"])
def test_router_not_ready_says_smgs_reason(reason):
    # smg's 503 carries a reason and no counts: no Ready prefill+decode pair yet, or SIGTERM received.
    client = client_for({"/readiness": (503, {"status": "not ready", "reason": reason})})
    observation = router_observation(client, "http://r", 2)
    assert not observation.ready
    assert observation.state == f"http://r/readiness answered 503: {reason}, expected 2/2 workers healthy"


def test_unreachable_is_not_ready():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    # The state names the cause, as probes.http words it, for the journal line of a gate that gave up.
    worker = worker_observation(client, "http://w", "decode")
    assert not worker.ready and worker.state == "http://w unreachable: ConnectError: connection refused"
    router = router_observation(client, "http://r", 2)
    assert not router.ready and router.state == "http://r unreachable: ConnectError: connection refused"


def test_wait_gives_up_at_the_deadline_with_the_last_state():
    now = [0.0]
    probes = []

    def probe():
        probes.append(now[0])
        return Observation(False, f"still starting at {now[0]:g}")

    result = wait_until_ready(probe, timeout=10, interval=3, clock=lambda: now[0],
                              sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert not result.ready
    assert probes == [0, 3, 6, 9, 10]
    assert result.state == "still starting at 10"


def test_wait_returns_as_soon_as_ready():
    answers = iter([Observation(False, "a"), Observation(True, "b")])
    result = wait_until_ready(lambda: next(answers), timeout=60, interval=0, sleep=lambda s: None)
    assert result == Observation(True, "b")


@pytest.fixture
def worker_server():
    state = {"healthy": False}

    class Handler(JsonHandler):
        def do_GET(self):
            if self.path == "/health":
                status, body = (200, {}) if state["healthy"] else (503, {})
            elif self.path == "/model_info":
                status, body = 200, {"disaggregation_mode": "decode"}
            else:
                status, body = 404, {}
            self.send_json(status, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def deployment_with_decode_port(tmp_path, port):
    import tomllib

    from pdserve.schema.loading import default_profile_text

    data = tomllib.loads(default_profile_text())
    data["decode"]["port"] = port
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(data))
    return path


def test_wait_ready_command_against_a_live_server(worker_server, tmp_path):
    port, state = worker_server
    config = deployment_with_decode_port(tmp_path, port)
    runner = CliRunner()
    late = runner.invoke(main, ["wait-ready", "decode", "-c", str(config), "--timeout", "0.3", "--interval", "0.1"])
    assert late.exit_code == 1
    assert "not ready after 0.3 s; last state: GET http://127.0.0.1:" in late.output
    assert "journalctl -u sglang-dsv4-decode" in late.output
    state["healthy"] = True
    ready = runner.invoke(main, ["wait-ready", "decode", "-c", str(config), "--timeout", "5", "--interval", "0.1"])
    assert ready.exit_code == 0, ready.output
    assert "sglang-dsv4-decode ready" in ready.output



def test_keyed_server_mode_comes_from_open_metrics():
    """A keyed fallback answers /model_info 401; its mode is read from /metrics' engine_type label."""
    metrics = 'sglang:max_total_num_tokens{model_name="m",engine_type="unified",tp_rank="0"} 1000\n'
    keyed = httpx.Client(transport=httpx.MockTransport(lambda request: {
        "/health": httpx.Response(200),
        "/model_info": httpx.Response(401, json={"error": "Unauthorized"}),
        "/metrics": httpx.Response(200, text=metrics),
    }[request.url.path]))
    assert worker_observation(keyed, "http://w", "null").ready
    observation = worker_observation(keyed, "http://w", "decode")
    assert not observation.ready
    assert "engine_type=unified, expected decode" in observation.state
