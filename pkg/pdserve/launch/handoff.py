"""One real PD hand-off through a (re)started worker, sent the way the router sends a request.

SGLang's first KV transfer after a server starts stalls (~7 s on one H200 with NIXL and SGLang 0.5.17,
2026-12-04, docs/reference-deployment.md): whichever request comes first pays it. The readiness
gate sends that first request itself, before the router takes the worker (back): one prefill /generate
and one decode /generate carrying the same bootstrap_host, bootstrap_port and bootstrap_room, sent at
once, as the router pairs them. The decode fetches the room's KV from the prefill's bootstrap server,
so the decode's 200 proves a hand-off went through the pair.

The request body is SGLang's native GenerateReqInput (sglang/srt/managers/io_struct.py, checked by the
contract in sglang/api/v1/api_types.py): token ids rather than text, so no tokenizer or chat template
takes part; greedy, a few new tokens, EOS ignored so the decode really generates. A restarted worker is
warmed against one server of the other role; with several, the first that answers as ready (file order).
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from pdserve.launch.gate import Observation, worker_observation
from pdserve.probes import http
from pdserve.probes.answers import shown
from pdserve.probes.observations import HttpObs
from pdserve.schema.config import Deployment
from pdserve.schema.derived import disaggregation_mode
from pdserve.schema.topology import Server, peer_role, servers

# SGLang's own warm-up of a disaggregated server sends these ids (http_server.py, _execute_server_warmup):
# ids every vocabulary has.
WARMUP_INPUT_IDS = (10, 11, 12, 13)
WARMUP_NEW_TOKENS = 4
# A 4-token answer is a few hundred bytes; anything near this bound is not SGLang's answer.
ANSWER_MAX_BYTES = 64 * 1024
RID_PREFIX = "pdserve-warmup-"


@dataclass(frozen=True)
class Pair:
    prefill: Server
    decode: Server

    def peer_of(self, server: Server) -> Server:
        return self.decode if server.role == "prefill" else self.prefill


def pairs_for(dep: Deployment, server: Server) -> list[Pair]:
    """`server` with each server of the other role, in file order (the order warm-up tries them)."""
    peers = servers(dep, peer_role(server.role))
    return [Pair(server, peer) if server.role == "prefill" else Pair(peer, server) for peer in peers]


def new_room() -> int:
    """A bootstrap room as the router draws it: random, below 2**63 (SGLang keeps rooms in an int64)."""
    return secrets.randbits(63)


def bootstrap_host(prefill: Server) -> str:
    """Where the decode reaches the prefill's bootstrap server: the host of the prefill's URL, as the
    router takes it from the --prefill URL it was given (a bracketed IPv6 literal loses its brackets)."""
    return urlsplit(prefill.url).hostname or prefill.listen_host


def request_body(pair: Pair, room: int) -> dict[str, object]:
    """The GenerateReqInput both servers get; the same body, as the router sends one request to both."""
    assert pair.prefill.bootstrap_port is not None, "a prefill server always has a bootstrap port"
    return {
        "rid": f"{RID_PREFIX}{room:016x}",
        "input_ids": list(WARMUP_INPUT_IDS),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": WARMUP_NEW_TOKENS, "ignore_eos": True},
        "stream": False,
        "bootstrap_host": bootstrap_host(pair.prefill),
        "bootstrap_port": pair.prefill.bootstrap_port,
        "bootstrap_room": room,
    }


def _leg(name: str, seen: HttpObs) -> str | None:
    """Why one leg's answer is not a served /generate, or None when it is."""
    if seen.status is None:
        return f"{name} {seen.url}: no answer ({seen.error})"
    if seen.error:
        return f"{name} {seen.url} answered {seen.status}: {seen.error}"
    if seen.status != 200:
        return f"{name} {seen.url} answered {seen.status}: {shown(seen.body)}"
    body = seen.body
    if not isinstance(body, dict) or "error" in body or not isinstance(body.get("meta_info"), dict):
        return f"{name} {seen.url} answered 200 with {shown(body)}, expected SGLang's generate answer (meta_info)"
    return None


def judge(pair: Pair, room: int, prefill: HttpObs, decode: HttpObs, seconds: float) -> Observation:
    """The hand-off's outcome from both answers. The decode's answer is the proof (it holds only once the
    KV arrived); a failed prefill leg is named first, as it is usually the cause of the decode's."""
    problems = [p for p in (_leg(f"prefill {pair.prefill.name}", prefill), _leg(f"decode {pair.decode.name}", decode))
                if p]
    if problems:
        return Observation(False, f"KV hand-off {pair.prefill.name} -> {pair.decode.name} (room {room}) failed "
                                  f"after {seconds:.1f} s: " + "; ".join(problems))
    return Observation(True, f"KV hand-off {pair.prefill.name} -> {pair.decode.name} (room {room}) went through "
                             f"in {seconds:.1f} s")


def hand_off(client: httpx.Client, pair: Pair, room: int | None = None) -> Observation:
    """Send the pair's two requests at once and judge them; each is bounded by `client` (its per-request
    seconds and its not-after deadline) and by ANSWER_MAX_BYTES."""
    room = new_room() if room is None else room
    body = request_body(pair, room)
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="handoff") as pool:
        legs = [pool.submit(http.exchange, client, "POST", f"{s.url}/generate", body, max_bytes=ANSWER_MAX_BYTES)
                for s in (pair.prefill, pair.decode)]
        prefill, decode = (leg.result() for leg in legs)
    return judge(pair, room, prefill, decode, time.monotonic() - began)


@dataclass
class WarmUp:
    """One warm-up attempt per call (a Probe): a hand-off with each peer that answers as ready, in file order,
    until one goes through. Not ready while none did; the state names each peer and why. `met_a_peer` says
    whether any attempt found a peer ready: without one no hand-off can be tried, which is not the worker's
    fault (the last of a pair to start carries the hand-off through both)."""

    dep: Deployment
    server: Server
    probe_client: httpx.Client
    handoff_client: httpx.Client
    met_a_peer: bool = False

    def __call__(self) -> Observation:
        pairs = pairs_for(self.dep, self.server)
        if not pairs:
            return Observation(False, f"deployment {self.dep.name} has no server to pair {self.server.name} with")
        failed = []
        for pair in pairs:
            peer = pair.peer_of(self.server)
            seen = worker_observation(self.probe_client, peer.url, disaggregation_mode(peer.role))
            if seen.ready:
                self.met_a_peer = True
                outcome = hand_off(self.handoff_client, pair)
                if outcome.ready:
                    return outcome
                failed.append(outcome.state)  # a broken peer must not keep the next one from being tried
            else:
                failed.append(f"peer {peer.name}: {seen.state}")
        return Observation(False, "no KV hand-off went through yet: " + "; ".join(failed))
