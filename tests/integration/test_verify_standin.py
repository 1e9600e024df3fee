"""The stand-in SGLang worker (tests/fixtures/standin_sglang): it must serve SGLang's shapes and
misbehave on request, or the verifier's tests prove nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))

from standin_sglang import make_shim
from standin_sglang.launch import env_with_fixtures, free_ports, start, start_standin, stop, wait_http

pytestmark = pytest.mark.integration

KEYED_LAUNCHER = Path(__file__).resolve().parents[2] / "pkg" / "pdserve" / "launch" / "keyed_launch.py"
START_TIMEOUT = 60  # importing sglang's parser takes ~5 s on an idle core; CI has two busy ones


def _args(port: int, mode: str, bootstrap: int | None = None) -> list[str]:
    args = ["--model-path", "/models/standin", "--served-model-name", "standin", "--host", "127.0.0.1",
            "--port", str(port), "--tp-size", "4", "--mem-fraction-static", "0.8", "--context-length", "32768",
            "--chunked-prefill-size", "4096", "--enable-metrics", "--reasoning-parser", "deepseek-v4",
            "--tool-call-parser", "deepseekv4", "--disaggregation-mode", mode]
    if bootstrap:
        args += ["--disaggregation-bootstrap-port", str(bootstrap)]
    return args


@pytest.fixture
def pd_pair(tmp_path, request):
    delay = getattr(request, "param", 0)
    p_port, b_port, d_port = free_ports(3)
    prefill = start_standin(_args(p_port, "prefill", b_port), tmp_path / "prefill.log")
    decode = start_standin(_args(d_port, "decode"), tmp_path / "decode.log",
                           knobs={"PDSERVE_STANDIN_STARTUP_DELAY": str(delay), "PDSERVE_STANDIN_TRANSFER_TIMEOUT": "1"})
    try:
        yield {"prefill": f"http://127.0.0.1:{p_port}", "decode": f"http://127.0.0.1:{d_port}",
               "bootstrap": b_port, "procs": (prefill, decode), "logs": tmp_path}
    finally:
        stop(prefill)
        stop(decode)


@pytest.mark.parametrize("pd_pair", [5], indirect=True)
def test_standin_serves_sglang_shapes_and_pd_handoff(pd_pair):
    prefill, decode = pd_pair["prefill"], pd_pair["decode"]
    assert wait_http(f"{prefill}/health", START_TIMEOUT, proc=pd_pair["procs"][0]) == 200
    # The decode was told to start slowly: 503 first, as SGLang answers while loading.
    assert wait_http(f"{decode}/model_info", START_TIMEOUT, proc=pd_pair["procs"][1]) == 200
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{decode}/health").status_code == 503
        assert wait_http(f"{decode}/health", 15) == 200
        info = client.get(f"{decode}/server_info").json()
        assert info["tp_size"] == 4 and info["disaggregation_mode"] == "decode"
        assert info["context_length"] == 32768 and info["chunked_prefill_size"] == 4096
        assert info["max_total_num_tokens"] == 800000  # 0.8 * 1e6, in whole 256-token pages
        assert info["internal_states"][0]["memory_usage"]["token_capacity"] == 800000
        assert info["version"]
        model = client.get(f"{prefill}/model_info").json()
        assert model["disaggregation_mode"] == "prefill" and model["tool_call_parser"] == "deepseekv4"
        assert client.get(f"{decode}/v1/models").json()["data"][0]["max_model_len"] == 32768
        metrics = client.get(f"{decode}/metrics").text
        assert 'sglang:max_total_num_tokens{model_name="standin",engine_type="decode"' in metrics
        assert "sglang:num_transfer_failed_reqs_total" in metrics

        request = {"model": "standin", "messages": [{"role": "user", "content": "hello"}]}
        # Straight to the decode, without the router's bootstrap fields: refused, as in SGLang PD mode.
        assert client.post(f"{decode}/v1/chat/completions", json=request).status_code == 400
        # What the router does: the same request to both, with bootstrap host/port/room added.
        routed = {**request, "bootstrap_host": "127.0.0.1", "bootstrap_port": pd_pair["bootstrap"],
                  "bootstrap_room": 12345}
        assert client.post(f"{prefill}/v1/chat/completions", json=routed).status_code == 200
        body = client.post(f"{decode}/v1/chat/completions", json=routed).json()
        assert body["object"] == "chat.completion" and "hello" in body["choices"][0]["message"]["content"]
        # A room the prefill never saw (or a wrong bootstrap port) fails the KV hand-off.
        lost = client.post(f"{decode}/v1/chat/completions", json={**routed, "bootstrap_room": 999}, timeout=30)
        assert lost.status_code == 500 and "KV transfer failed" in lost.json()["message"]
        assert "num_transfer_failed_reqs_total{" in client.get(f"{decode}/metrics").text


def test_standin_faults_at_run_time(pd_pair):
    decode = pd_pair["decode"]
    assert wait_http(f"{decode}/health", START_TIMEOUT, proc=pd_pair["procs"][1]) == 200
    with httpx.Client(timeout=10) as client:
        assert client.post(f"{decode}/_standin/faults", json={"faults": ["nonsense"]}).status_code == 400
        client.post(f"{decode}/_standin/faults", json={"faults": ["wrong_mode"], "max_total_num_tokens": 1024})
        assert client.get(f"{decode}/model_info").json()["disaggregation_mode"] == "prefill"
        assert client.get(f"{decode}/server_info").json()["max_total_num_tokens"] == 1024


def test_standin_shim_and_keyed_launcher_enforce_api_key(tmp_path):
    """`python -m sglang.launch_server` through the shim, started by pdserve's keyed launcher as a unit would."""
    shim = make_shim(tmp_path / "shim")
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "api-key").write_text("sekrit\n")
    (port,) = free_ports(1)
    env = env_with_fixtures({"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}, first=[str(shim)])
    version = subprocess.run([sys.executable, "-c", "import sglang.launch_server as m, sglang.srt.server_args as a;"
                              "print(m.__file__); print(a.__file__)"],
                             env=env, capture_output=True, text=True, timeout=60)
    shim_file, real_file = version.stdout.split()
    assert shim_file.startswith(str(shim)) and not real_file.startswith(str(shim))
    proc = start([sys.executable, str(KEYED_LAUNCHER), "server", "api-key", "--", *_args(port, "null")],
                 tmp_path / "keyed.log", env)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_http(f"{url}/health", START_TIMEOUT, proc=proc) == 200, (tmp_path / "keyed.log").read_text()
        with httpx.Client(timeout=10) as client:
            request = {"model": "standin", "messages": [{"role": "user", "content": "hi"}]}
            denied = client.post(f"{url}/v1/chat/completions", json=request)
            assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
            assert client.get(f"{url}/server_info").status_code == 401
            ok = client.post(f"{url}/v1/chat/completions", json=request, headers={"Authorization": "Bearer sekrit"})
            assert ok.status_code == 200
            info = client.get(f"{url}/server_info", headers={"Authorization": "Bearer sekrit"}).json()
            assert "api_key" not in info and "sekrit" not in json.dumps(info)
        assert "argv parsed by: sglang" in (tmp_path / "keyed.log").read_text()
    finally:
        stop(proc)


@pytest.mark.parametrize("knobs,status,says", [
    ({"PDSERVE_STANDIN_CRASH_AFTER": "1"}, 1, "crashing on purpose"),
    ({"PDSERVE_STANDIN_FAULTS": "no_such_fault"}, 2, "unknown fault(s) ['no_such_fault']"),
], ids=["crash-after", "unknown-fault"])
def test_standin_crashes_on_request_and_rejects_unknown_faults(tmp_path, knobs, status, says):
    """PDSERVE_STANDIN_CRASH_AFTER makes it exit 1 (what Restart=on-failure reacts to); an unknown fault exits 2."""
    (port,) = free_ports(1)
    proc = start_standin(_args(port, "null"), tmp_path / "standin.log", knobs=knobs)
    try:
        assert proc.wait(timeout=START_TIMEOUT) == status
        assert says in (tmp_path / "standin.log").read_text()
    finally:
        stop(proc)
