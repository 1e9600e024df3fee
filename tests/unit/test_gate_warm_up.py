"""The warm-up gate's pure parts: the hand-off request (judged by SGLang's own /generate contract), how its
answers are read, which peers it pairs with, smg's worker API as the membership steps read and write it
(hostile answers included), the peer wait, and the units that run it. The same against the real smg
binary and stand-in workers: tests/integration/test_gate_warm_up_router.py."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import httpx
import pytest

from pdserve.launch.gate import Observation
from pdserve.launch.handoff import (
    RID_PREFIX,
    Pair,
    WarmUp,
    bootstrap_host,
    judge,
    new_room,
    pairs_for,
    request_body,
)
from pdserve.launch.router_membership import (
    Membership,
    RouterRef,
    admitted,
    listed,
    routers_seen_from,
    worker_spec,
)
from pdserve.launch.warm import router_headers, warm_and_rejoin
from pdserve.probes.observations import HttpObs
from pdserve.render.toolchain import Toolchain
from pdserve.render.units import render_units
from pdserve.schema.derived import API_KEY_CREDENTIAL, MISSING_KEY_STAND_IN
from pdserve.schema.loading import default_profile_text, deployment_from_data, load
from pdserve.schema.topology import servers
from tests.fixtures.fake_clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]
FOUR_HOST = ROOT / "hosts/four-host/deployment.toml"
TOOLS = Toolchain("/opt/sglang/bin/python", "/usr/bin/numactl", "/usr/bin/pdserve")


def reference():
    return deployment_from_data(tomllib.loads(default_profile_text()), "t").deployment


def four_host(**router):
    data = tomllib.loads(FOUR_HOST.read_text())
    data["router"].update(router)
    return deployment_from_data(data, "t").deployment


def single_pair():
    dep = reference()
    prefill, decode = servers(dep, "prefill")[0], servers(dep, "decode")[0]
    return dep, Pair(prefill, decode)


# -- the request ----------------------------------------------------------------------------------------


def test_the_request_is_what_sglangs_generate_contract_accepts_with_the_bootstrap_fields():
    from sglang.api.v1.api_types import GenerateRequest

    _, pair = single_pair()
    room = new_room()
    body = request_body(pair, room)
    parsed = GenerateRequest.from_json_value(json.loads(json.dumps(body)))  # as it travels: JSON
    assert (parsed.bootstrap_host, parsed.bootstrap_port, parsed.bootstrap_room) == ("127.0.0.1", 8998, room)
    assert parsed.sampling_params.max_new_tokens and parsed.sampling_params.ignore_eos is True
    assert parsed.stream is False and parsed.input_ids and parsed.rid == f"{RID_PREFIX}{room:016x}"
    assert all(0 <= new_room() < 2**63 for _ in range(200))  # SGLang keeps rooms in an int64


def test_the_bootstrap_host_is_the_prefills_url_host_without_brackets():
    data = tomllib.loads(default_profile_text())
    data["prefill"]["host"] = "::1"
    dep = deployment_from_data(data, "t").deployment
    prefill = servers(dep, "prefill")[0]
    assert prefill.url.startswith("http://[::1]:") and bootstrap_host(prefill) == "::1"


def test_several_servers_pair_with_every_server_of_the_other_role_in_file_order():
    dep = four_host()
    prefill_1, prefill_2 = servers(dep, "prefill")
    (decode_1,) = servers(dep, "decode")
    assert [(p.prefill.name, p.decode.name) for p in pairs_for(dep, prefill_2)] == [(prefill_2.name, decode_1.name)]
    assert [p.prefill.name for p in pairs_for(dep, decode_1)] == [prefill_1.name, prefill_2.name]


# -- reading the answers --------------------------------------------------------------------------------

OK = {"text": "a b", "output_ids": [1, 2], "meta_info": {"id": "x", "finish_reason": {"type": "length", "length": 2}}}


@pytest.mark.parametrize("prefill, decode, words", [
    (HttpObs("p", 200, OK), HttpObs("d", None, None, "ConnectError: refused"),
     "decode decode d: no answer (ConnectError"),
    (HttpObs("p", 200, OK), HttpObs("d", 500, {"message": "KV transfer failed"}), "decode decode d answered 500"),
    (HttpObs("p", 400, {"error": "bad"}), HttpObs("d", 500, {}), "prefill prefill p answered 400"),
    (HttpObs("p", 200, OK), HttpObs("d", 200, {"error": {"message": "x"}}), "expected SGLang's generate answer"),
    (HttpObs("p", 200, OK), HttpObs("d", 200, "plain text"), "expected SGLang's generate answer"),
    (HttpObs("p", 200, OK), HttpObs("d", 200, None, "the answer is not JSON"), "answered 200: the answer is not JSON"),
    (HttpObs("p", 302, None, "a redirect to 'http://x', not followed"), HttpObs("d", 200, OK), "not followed"),
])
def test_a_hand_off_went_through_only_when_both_legs_are_served_generates(prefill, decode, words):
    _, pair = single_pair()
    seen = judge(pair, 7, prefill, decode, 1.25)
    assert not seen.ready and words in seen.state and "(room 7) failed after 1.2 s" in seen.state
    assert judge(pair, 7, HttpObs("p", 200, OK), HttpObs("d", 200, OK), 3.04) == Observation(
        True, "KV hand-off prefill -> decode (room 7) went through in 3.0 s")


def peers(routes):
    """A client whose answers come from routes[(method, host:port, path)] -> (status, body) or a callable."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        key = (request.method, f"{request.url.host}:{request.url.port}", request.url.path)
        seen.append((key, json.loads(request.content) if request.content else None))
        answer = routes.get(key)
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        status, body = answer(request) if callable(answer) else answer
        return httpx.Response(status, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler)), seen


def healthy(port, mode):
    return {("GET", f"10.20.0.{port[0]}:{port[1]}", "/health"): (200, {}),
            ("GET", f"10.20.0.{port[0]}:{port[1]}", "/model_info"): (200, {"disaggregation_mode": mode})}


def test_a_broken_peer_does_not_keep_the_next_from_carrying_the_hand_off():
    dep = four_host()
    decode = servers(dep, "decode")[0]  # peers: prefill-1 on gpu-a (10.20.0.1), prefill-2 on gpu-b
    routes = {**healthy((1, 30000), "prefill"), **healthy((2, 30000), "prefill"),
              ("POST", "10.20.0.1:30000", "/generate"): (500, {"error": "broken"}),
              ("POST", "10.20.0.2:30000", "/generate"): (200, OK),
              ("POST", "10.20.0.3:30002", "/generate"): (200, OK)}
    client, seen = peers(routes)
    warm = WarmUp(dep, decode, client, client)
    result = warm()
    assert result.ready and "prefill-2 -> decode-1" in result.state and warm.met_a_peer
    # The decode's request named the prefill that answered it: the same room, that prefill's bootstrap.
    sent = [body for (method, where, path), body in seen if path == "/generate" and where == "10.20.0.3:30002"]
    assert [b["bootstrap_host"] for b in sent] == ["10.20.0.1", "10.20.0.2"]
    assert len({b["bootstrap_room"] for b in sent}) == 2


def test_no_peer_ready_is_not_a_peer_met():
    dep = four_host()
    decode = servers(dep, "decode")[0]
    client, _ = peers({("GET", "10.20.0.1:30000", "/health"): (503, {})})
    warm = WarmUp(dep, decode, client, client)
    result = warm()
    assert not result.ready and not warm.met_a_peer
    assert "peer prefill-1: GET http://10.20.0.1:30000/health answered 503" in result.state
    assert "peer prefill-2: http://10.20.0.2:30000 unreachable" in result.state


ROUTER = "127.0.0.1:30001"


def router_routes(workers):
    """smg's worker API over a list the test can watch: GET lists, DELETE removes, POST adds healthy."""
    def listing(_):
        return 200, {"workers": workers, "total": len(workers)}

    def delete(request):
        wid = request.url.path.rsplit("/", 1)[-1]
        workers[:] = [w for w in workers if w["id"] != wid]
        return 202, {"status": "accepted"}

    def add(request):
        spec = json.loads(request.content)
        workers.append({**spec, "id": "new", "is_healthy": True, "status": "ready"})
        return 202, {"status": "accepted"}

    return {("GET", ROUTER, "/workers"): listing, ("POST", ROUTER, "/workers"): add,
            **{("DELETE", ROUTER, f"/workers/{w['id']}"): delete for w in workers}}


def test_with_no_peer_for_the_peer_wait_the_server_goes_back_unwarmed_and_says_so():
    dep, pair = single_pair()
    workers = []
    client, _ = peers(router_routes(workers))  # the decode (peer) answers nothing
    clock, said = FakeClock(), []
    result = warm_and_rejoin(dep, pair.prefill, client, client, deadline=100, interval=1, peer_wait=5,
                             sleep=clock.sleep, say=said.append, clock=clock)
    assert result.ready and result.state.startswith("ready, unwarmed: ")
    assert 5 <= clock.now < 7  # the peer wait, not the deadline
    assert any("no peer was ready within 5 s, so prefill goes back to the routers unwarmed" in s for s in said)
    assert [w["url"] for w in workers] == [pair.prefill.url]  # handed back all the same


def test_a_ready_peer_whose_hand_offs_fail_fails_the_gate_at_its_deadline_and_keeps_it_out():
    dep, pair = single_pair()
    workers = []
    routes = {**router_routes(workers),
              ("GET", "127.0.0.1:30002", "/health"): (200, {}),
              ("GET", "127.0.0.1:30002", "/model_info"): (200, {"disaggregation_mode": "decode"}),
              ("POST", "127.0.0.1:30000", "/generate"): (200, OK),
              ("POST", "127.0.0.1:30002", "/generate"): (500, {"message": "KV transfer failed"})}
    client, _ = peers(routes)
    clock = FakeClock()
    result = warm_and_rejoin(dep, pair.prefill, client, client, deadline=30, interval=2, peer_wait=5,
                             sleep=clock.sleep, say=lambda s: None, clock=clock)
    assert not result.ready and "no KV hand-off went through prefill in time" in result.state
    assert "decode decode http://127.0.0.1:30002/generate answered 500" in result.state
    assert clock.now >= 30 and workers == []


# -- smg's worker API -----------------------------------------------------------------------------------


def test_the_worker_spec_is_what_the_routers_flags_say():
    _, pair = single_pair()
    assert worker_spec(pair.prefill) == {"url": "http://127.0.0.1:30000", "worker_type": "prefill",
                                         "bootstrap_port": 8998}
    assert worker_spec(pair.decode) == {"url": "http://127.0.0.1:30002", "worker_type": "decode"}


@pytest.mark.parametrize("body, words", [
    ([], "expected {\"workers\": [...]}"),
    ({"workers": "all"}, "expected {\"workers\": [...]}"),
    ({"workers": [{"url": "http://w"}]}, "lists http://w without an id"),
    ({"workers": [{"url": "http://w", "id": 7}]}, "lists http://w without an id"),
])
def test_an_odd_worker_list_is_named(body, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("{", r"\{")):
        listed(body, "http://w")


def test_listed_and_admitted_read_smg_and_sglang_router_0_3_2_entries():
    smg = {"id": "a", "url": "http://w", "is_healthy": True, "status": "ready"}
    assert listed({"workers": [{"url": "http://x", "id": "b"}, smg]}, "http://w") is smg
    assert listed({"workers": []}, "http://w") is None
    assert admitted(smg) and not admitted({**smg, "status": "draining"}) and not admitted({**smg, "is_healthy": False})
    assert admitted({"id": "a", "url": "http://w", "is_healthy": True})  # 0.3.2: no status field
    assert not admitted(None)


def membership(routes, server):
    client, seen = peers(routes)
    clock = FakeClock()
    return Membership(client, RouterRef("", f"http://{ROUTER}"), server, {}, clock=clock, sleep=clock.sleep), seen


def test_leave_removes_and_waits_until_the_router_no_longer_lists_it():
    _, pair = single_pair()
    workers = [{"id": "p1", "url": pair.prefill.url, "is_healthy": False, "status": "ready"},
               {"id": "d1", "url": pair.decode.url, "is_healthy": True, "status": "ready"}]
    m, seen = membership(router_routes(workers), pair.prefill)
    assert m.leave(5) == Observation(True, f"router http://{ROUTER} removed prefill")
    assert [w["id"] for w in workers] == ["d1"]
    assert (("DELETE", ROUTER, "/workers/p1"), None) in seen
    again = m.leave(5)
    assert again.ready and "does not list prefill" in again.state


def leave_while_the_router_keeps_listing_it(status: str) -> Observation:
    """The prefill's leave (3 s) from a router that accepts the removal and goes on listing the prefill, healthy
    and with `status`."""
    _, pair = single_pair()
    workers = [{"id": "p1", "url": pair.prefill.url, "is_healthy": True, "status": status}]
    routes = {("GET", ROUTER, "/workers"): (200, {"workers": workers}),
              ("DELETE", ROUTER, "/workers/p1"): (202, {})}
    m, _ = membership(routes, pair.prefill)
    return m.leave(3)


def test_a_removal_the_router_never_carries_out_is_reported_after_the_timeout():
    left = leave_while_the_router_keeps_listing_it("ready")
    assert not left.ready and "still lists prefill (is_healthy=True (a boolean), status='ready'" in left.state


def test_a_worker_the_router_drains_is_out_at_once():
    """smg drains a removed worker that it still holds Ready (5 s, not configurable in 1.13.0) before it drops
    the entry; a draining worker gets no new request, so the gate need not wait for the entry to go."""
    left = leave_while_the_router_keeps_listing_it("draining")
    assert left.ready and "removed prefill" in left.state, left


def test_a_router_that_is_down_has_nothing_to_remove_and_registers_the_server_itself():
    _, pair = single_pair()
    m, _ = membership({}, pair.prefill)
    for result in (m.leave(3), m.join(3)):
        assert result.ready and "unreachable" in result.state and "registers prefill from its own flags" in result.state


def test_a_keyed_router_refusing_the_worker_api_is_named():
    _, pair = single_pair()
    m, _ = membership({("GET", ROUTER, "/workers"): (401, {"error": "Unauthorized"})}, pair.prefill)
    left = m.leave(3)
    assert not left.ready and "answered 401 to GET /workers: its worker API needs the router's API key" in left.state
    # Nothing was removed, so nothing holds the gate: the router takes the worker back by itself.
    joined = m.join(3)
    assert joined.ready and "takes prefill back on its own health check, before the warm-up" in joined.state


def keyed(tmp_path):
    """The reference with a keyed router whose key file is not here (the unit passes it as a credential)."""
    dep, _ = single_pair()
    router = dep.router.model_copy(update={"api_key_file": str(tmp_path / "absent.key")})
    return dep.model_copy(update={"router": router})


def test_the_gates_send_the_routers_key_from_the_units_credential(tmp_path, monkeypatch):
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / API_KEY_CREDENTIAL).write_text("s3cret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "creds"))
    said: list[str] = []
    assert router_headers(keyed(tmp_path), said.append) == {"Authorization": "Bearer s3cret"}
    assert said == []


def test_a_host_without_the_key_file_gets_the_stand_in_and_the_gate_says_what_to_copy(tmp_path, monkeypatch):
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / API_KEY_CREDENTIAL).write_text(MISSING_KEY_STAND_IN)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "creds"))
    said: list[str] = []
    dep = keyed(tmp_path)
    assert router_headers(dep, said.append) == {}
    assert len(said) == 1 and f"key file {dep.router.api_key_file} was not on this host" in said[0]
    assert "copy it here" in said[0] and MISSING_KEY_STAND_IN not in said[0]


def test_without_a_credential_an_unreadable_key_file_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    said: list[str] = []
    dep = keyed(tmp_path)
    assert router_headers(dep, said.append) == {}
    assert len(said) == 1 and "cannot read the API key file" in said[0] and "absent.key" in said[0]


def test_a_worker_id_from_the_router_is_quoted_whole_in_the_removal_path():
    _, pair = single_pair()
    entry = {"id": "../p1?x=1#y", "url": pair.prefill.url, "is_healthy": True, "status": "ready"}
    sent: list[tuple[str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, request.url.raw_path))
        return httpx.Response(200, json={"workers": [entry]}) if request.method == "GET" else httpx.Response(404)

    clock = FakeClock()
    m = Membership(httpx.Client(transport=httpx.MockTransport(handler)), RouterRef("", f"http://{ROUTER}"),
                   pair.prefill, {}, clock=clock, sleep=clock.sleep)
    m.leave(1)
    assert ("DELETE", b"/workers/..%2Fp1%3Fx%3D1%23y") in sent, sent


def slow_router(request):
    raise httpx.ReadTimeout("no answer in time", request=request)


def test_a_router_that_answers_too_late_has_not_let_go_and_is_not_called_down():
    _, pair = single_pair()
    m, _ = membership({("GET", ROUTER, "/workers"): slow_router}, pair.prefill)
    left = m.leave(1)
    assert not left.ready and "did not answer GET /workers" in left.state and "unreachable" not in left.state
    joined = m.join(1)
    assert not joined.ready and "did not answer GET /workers" in joined.state


def test_a_join_retries_a_late_answer_until_the_router_takes_the_worker(monkeypatch):
    _, pair = single_pair()
    workers: list[dict] = []
    routes = router_routes(workers)
    answers = iter([slow_router])

    def first_late(request):
        late = next(answers, None)
        return late(request) if late else routes[("GET", ROUTER, "/workers")](request)

    m, seen = membership({**routes, ("GET", ROUTER, "/workers"): first_late}, pair.prefill)
    joined = m.join(5)
    assert joined.ready and "routes to prefill again" in joined.state, joined
    assert any(key[0] == "POST" for key, _ in seen)


def test_join_adds_with_the_routers_own_spec_and_waits_until_routable():
    _, pair = single_pair()
    workers = []
    checks = []

    def listing(_):
        checks.append(1)
        # The router queues the addition: the worker shows up pending, then ready.
        shown = [{**w, "is_healthy": len(checks) > 3} for w in workers]
        return 200, {"workers": shown}

    routes = {**router_routes(workers), ("GET", ROUTER, "/workers"): listing}
    m, seen = membership(routes, pair.prefill)
    joined = m.join(10)
    assert joined == Observation(True, f"router http://{ROUTER} routes to prefill again")
    assert [body for (method, _, _), body in seen if method == "POST"] == [worker_spec(pair.prefill)]
    assert len(checks) > 3


def test_join_takes_409_as_registered_meanwhile():
    _, pair = single_pair()
    entry = {"id": "p1", "url": pair.prefill.url, "is_healthy": True, "status": "ready"}
    routes = {("GET", ROUTER, "/workers"): (200, {"workers": []}),
              ("POST", ROUTER, "/workers"): (409, {"code": "WORKER_ALREADY_EXISTS"})}
    m, _ = membership(routes, pair.prefill)
    routes[("GET", ROUTER, "/workers")] = lambda _: (200, {"workers": [entry]})
    assert m.join(5).ready


# -- which routers, and the units -----------------------------------------------------------------------


def test_routers_reached_from_a_servers_host():
    one = reference()
    assert routers_seen_from(one, "") == ([RouterRef("", "http://127.0.0.1:30001")], [])
    wildcard = four_host()  # the example's router: gpu-c, on 0.0.0.0
    assert routers_seen_from(wildcard, "gpu-c") == ([RouterRef("gpu-c", "http://127.0.0.1:30001")], [])
    assert routers_seen_from(wildcard, "gpu-a") == ([RouterRef("gpu-c", "http://10.20.0.3:30001")], [])
    both = four_host(hosts=["gpu-c", "gpu-d"])
    assert routers_seen_from(both, "gpu-a")[0] == [RouterRef("gpu-c", "http://10.20.0.3:30001"),
                                                   RouterRef("gpu-d", "http://10.20.0.4:30001")]
    loopback = four_host(host="127.0.0.1", hosts=["gpu-c", "gpu-d"])
    assert routers_seen_from(loopback, "gpu-d") == ([RouterRef("gpu-d", "http://127.0.0.1:30001")], ["gpu-c"])


def directives(text, key):
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def test_each_pd_server_unit_leaves_the_routers_first_and_its_gate_warms_it():
    units = {u.name: u.text for u in render_units(reference(), TOOLS, "/etc/pdserve.json")}
    for role in ("prefill", "decode"):
        text = units[f"sglang-dsv4-{role}"]
        assert directives(text, "ExecStartPre") == [
            f"/usr/bin/pdserve leave-routers {role} --config /etc/pdserve.json --timeout 10"]
        post = directives(text, "ExecStartPost")
        assert len(post) == 1 and post[0].endswith(" --warm-up") and "--peer-wait" not in post[0]
    for other in ("sglang-dsv4-router", "sglang-dsv4"):
        assert not any("--warm-up" in v or "leave-routers" in v for v in directives(units[other], "ExecStartPost")
                       + directives(units[other], "ExecStartPre"))


def test_a_prefill_sharing_gpus_with_the_decode_does_not_wait_for_the_decode_ordered_after_it():
    data = tomllib.loads(default_profile_text())
    for role in ("prefill", "decode"):
        data[role].update(gpus=[0], mem_fraction_static=0.4)
        data[role].pop("tp_size", None)
    data["fallback"]["gpus"] = [0]
    data["fallback"].pop("tp_size", None)
    data["allow_shared_gpus"] = True
    units = {u.name: u.text for u in render_units(deployment_from_data(data, "t").deployment, TOOLS, "/c.json")}
    assert directives(units["sglang-dsv4-prefill"], "ExecStartPost")[0].endswith("--warm-up --peer-wait 0")
    assert "After=network-online.target sglang-dsv4-prefill.service" in units["sglang-dsv4-decode"]
    assert directives(units["sglang-dsv4-decode"], "ExecStartPost")[0].endswith("--warm-up")


def test_on_several_hosts_only_a_servers_node_0_unit_leaves_and_warms():
    dep = load(FOUR_HOST).deployment
    node0 = {u.name: u.text for u in render_units(dep, TOOLS, "/c.json", "gpu-c")}
    node1 = {u.name: u.text for u in render_units(dep, TOOLS, "/c.json", "gpu-d")}
    decode = next(text for name, text in node0.items() if name.endswith("decode-1"))
    assert directives(decode, "ExecStartPre") == [
        "/usr/bin/pdserve leave-routers decode --server decode-1 --config /c.json --timeout 10"]
    assert directives(decode, "ExecStartPost")[0].endswith("--warm-up")
    (other,) = node1.values()
    assert directives(other, "ExecStartPre") == [] and "--warm-up" not in directives(other, "ExecStartPost")[0]


def test_a_hostile_peers_endless_answer_is_cut_at_the_size_bound():
    from pdserve.launch.handoff import ANSWER_MAX_BYTES, hand_off

    _, pair = single_pair()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 30002:
            return httpx.Response(200, content=b"[" * (ANSWER_MAX_BYTES + 10),
                                  headers={"Content-Type": "application/json"})
        return httpx.Response(200, json=OK)

    # The bound is probes.http.read's, whatever the transport.
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        seen = hand_off(client, pair, 11)
    assert not seen.ready and "decode decode http://127.0.0.1:30002/generate: no answer (AnswerTooLarge" in seen.state
