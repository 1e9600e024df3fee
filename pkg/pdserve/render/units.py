"""systemd unit files for one host of a deployment. Pure: a deployment, a host and a toolchain in, unit texts
out. A single-host file is a one-host deployment: its host is the implied one (schema.placement).

Contract (ARCHITECTURE.md): After= means ready, so every unit gates its start on `pdserve wait-ready`
in ExecStartPost (SGLang and the router never notify systemd); the router Wants= and is After= the server
units of its host (it outlives their restarts) and its ExecStartPre= finds every server ready; the fallback
Conflicts= with every PD unit; the API key arrives through LoadCredential=. The text is render.unit_text's.

systemd orders the units of one host only. On several hosts, a server node's ExecStartPost= waits for its
server's API (node 0, perhaps on another host), and the router's gates wait briefly for the servers on its
host (their start has ended) and up to the servers' start timeout for those on other hosts, which load in
parallel and which no ordering can wait for; the router's TimeoutStartSec= grows by that wait.
"""

from __future__ import annotations

from dataclasses import replace

from pdserve.render.argv import Launch, launch, node_launch
from pdserve.render.toolchain import Toolchain
from pdserve.render.unit_text import Section, Unit, exactly, install_sections, render_ini, service_section, unit_header
from pdserve.render.unit_text import command_line as command_line  # read from here too (tests, drop-ins)
from pdserve.render.unit_text import environment_line as environment_line
from pdserve.schema import systemd_syntax
from pdserve.schema.config import Deployment
from pdserve.schema.derived import API_KEY_CREDENTIAL, ROUTER_START_TIMEOUT_SEC
from pdserve.schema.placement import Placed, Placement, place
from pdserve.schema.problems import ConfigError, Problem
from pdserve.schema.topology import IMPLIED_HOST, Node, server_named

# wait-ready gives up this much before systemd would kill it, so its own message reaches the journal.
READY_MARGIN_SEC = 10
# The router's ExecStartPre= check that the servers of its host are ready (their own starts have ended by then).
WORKER_GATE_SEC = 5
# A worker's ExecStartPre= taking it out of the routers: smg removes a worker within a second; a router that
# does not answer by then is left alone (the server must start either way).
LEAVE_ROUTERS_SEC = 10
PD_ROLES = ("prefill", "decode", "router")


def _service(name: str) -> str:
    return f"{name}.service"


def _which(p: Placed) -> list[str]:
    """How a gate names the server: by its role on the implied host, by its name on a named one."""
    return [] if p.host == IMPLIED_HOST else ["--server", p.name]


def _wait(tools: Toolchain, config_path: str, p: Placed, timeout: int, interval: str | None) -> list[str]:
    argv = [tools.pdserve, "wait-ready", p.role, *_which(p), "--config", config_path, "--timeout", str(max(timeout, 1))]
    return argv + (["--interval", interval] if interval else [])


def _sharing(placement: Placement, p: Placed) -> list[Placed]:
    """The prefill processes on a decode's host that use some of its GPUs (allow_shared_gpus)."""
    if p.role != "decode":
        return []
    return [q for q in placement.on(p.host) if q.role == "prefill" and set(q.gpus) & set(p.gpus)]


def _api(placement: Placement, p: Placed) -> Placed:
    """The process that serves `p`'s API: node 0 of its server."""
    return next(q for q in placement.placed if q.name == p.name and q.role == p.role and q.node_rank == 0)


def _describe(dep: Deployment, placement: Placement, p: Placed, run: Launch) -> str:
    numa = f", NUMA node {p.numa_node}" if p.numa_node is not None else ""
    gpus = ",".join(str(g) for g in p.gpus)
    if p.host == IMPLIED_HOST:
        if p.role == "router":
            return f"pdserve {dep.name}: smg router (PD) on {run.url}"
        what = "single SGLang server (fallback)" if p.role == "fallback" else f"SGLang {p.role} server"
        return f"pdserve {dep.name}: {what} on GPUs {gpus}{numa}, {run.url}"
    if p.role == "router":
        count = len([q for q in placement.of_role("prefill", "decode") if q.node_rank == 0])
        return f"pdserve {dep.name}: smg router (PD) on host {p.host}, {run.url}, in front of {count} servers"
    node = f" node {p.node_rank} of {p.nnodes}" if p.nnodes > 1 else ""
    return (f"pdserve {dep.name}: SGLang {p.role} server {p.name}{node} on host {p.host}, "
            f"GPUs {gpus}{numa}, {_api(placement, p).url}")


def _unit_section(dep: Deployment, placement: Placement, p: Placed, description: str) -> Section:
    here = placement.on(p.host)
    pd_units = [_service(q.unit) for q in here if q.role in PD_ROLES]
    fallback = [_service(q.unit) for q in here if q.role == "fallback"]
    entries: Section = [("Description", systemd_syntax.text_value(description)), ("Wants", "network-online.target")]
    servers = [_service(q.unit) for q in here if q.role in ("prefill", "decode")]
    after = ["network-online.target"]
    if p.role == "router" and servers:
        # Wants= pulls the servers in; After= holds the router until they are *ready*, because a server's
        # start only completes when its wait-ready gate has passed. Not Requires=: systemd restarts a
        # Requires= dependent with the server, so one crashed prefill took the public port down until it
        # had reloaded, and the prefill's restart queued behind the router's stop job. A server that failed
        # to start still keeps the router's process from starting: the router's ExecStartPre= gates
        # (WORKER_GATE_SEC) find it not ready.
        entries.append(("Wants", " ".join(servers)))
        after += servers
    elif _sharing(placement, p):
        # allow_shared_gpus: each server sizes its pool from the memory free when it starts, so two that
        # start together both count the other's share as free. After= (ordering only) starts the decode
        # once the prefill is ready, and a later prefill restart still leaves the decode alone.
        after += [_service(q.unit) for q in _sharing(placement, p)]
    elif p.role == "fallback":
        # Ordering only, so that a start of one layout waits for the other's stop to finish: systemd orders
        # the stop of a unit before the start of one ordered against it in either direction, and without
        # an ordering runs them at once. smg keeps its port open for 5 s after SIGTERM and then drains, so a
        # fallback started beside the router's stop found the public port taken ("Address already in use",
        # container tier); a worker's GPUs are only free once its process has gone, too.
        after += pd_units
    entries.append(("After", " ".join(after)))
    if fallback:
        # The two layouts share GPUs and the public port: starting one stops the other.
        entries.append(("Conflicts", " ".join(pd_units if p.role == "fallback" else fallback)))
    return [*entries, ("StartLimitIntervalSec", str(dep.systemd.start_limit_interval_sec)),
            ("StartLimitBurst", str(dep.systemd.start_limit_burst))]


def _service_section(dep: Deployment, placement: Placement, p: Placed, run: Launch, config_path: str,
                     tools: Toolchain) -> Section:
    load = dep.systemd.start_timeout_sec
    interval = None if p.host == IMPLIED_HOST else "2"
    if p.role == "router":
        # Every server's API: those on this host have ended their start by then (After=), so the gate only
        # confirms, briefly; those on other hosts may still be loading.
        apis = [q for q in placement.of_role("prefill", "decode") if q.node_rank == 0]
        gates = [_wait(tools, config_path, q, WORKER_GATE_SEC, "0.5") if q.host == p.host else
                 _wait(tools, config_path, q, load - READY_MARGIN_SEC, "2") for q in apis]
        remote = any(q.host != p.host for q in apis)
        ready = [tools.pdserve, "wait-ready", "router", "--config", config_path,
                 "--timeout", str(ROUTER_START_TIMEOUT_SEC - READY_MARGIN_SEC)]
        return service_section(dep, run, tools, start_timeout=ROUTER_START_TIMEOUT_SEC + (load if remote else 0),
                               gates=gates, ready=ready)
    ready = _wait(tools, config_path, p, load - READY_MARGIN_SEC, interval)
    if p.role == "fallback" or p.node_rank > 0:
        return service_section(dep, run, tools, start_timeout=load, gates=[], ready=ready)
    # The server's API runs on node 0: its unit alone takes it out of the routers and warms it.
    gates, ready = warm_start(tools, config_path, p.role, ready, _which(p))
    if any(p in _sharing(placement, q) for q in placement.on(p.host)):
        # The decode starts only once the prefill's start has ended (After=, see _unit_section): waiting
        # for it would hold both until the deadline. The decode's own gate warms the pair instead.
        ready += ["--peer-wait", "0"]
    return service_section(dep, run, tools, start_timeout=load, gates=gates, ready=ready,
                           gate_credentials=gate_credentials(dep))


def warm_start(tools: Toolchain, config_path: str, role: str, ready: list[str],
               server: list[str] | None = None) -> tuple[list[list[str]], list[str]]:
    """A PD server's start, warm: out of the routers first (ExecStartPre=), and a gate that hands it back
    only once a real KV hand-off went through it (ExecStartPost=), so that no client request pays SGLang's
    first-transfer stall after a start (launch.warm). `server`: ["--server", NAME] on several hosts."""
    leave = [tools.pdserve, "leave-routers", role, *(server or []), "--config", config_path,
             "--timeout", str(LEAVE_ROUTERS_SEC)]
    return [leave], [*ready, "--warm-up"]


def gate_credentials(dep: Deployment) -> dict[str, str]:
    """The credentials a PD server's own gates need: the router's key, when it has one. smg's worker API
    (DELETE and POST /workers, used by leave-routers and the warm-up) refuses a request without it (401),
    and a unit's User= cannot read the root-owned key file itself. The server process can read it too,
    which tells it nothing new: smg forwards the same key to every worker as the Bearer token of each
    request."""
    return {API_KEY_CREDENTIAL: dep.router.api_key_file} if dep.router.api_key_file else {}


def placed_launch(dep: Deployment, p: Placed, tools: Toolchain) -> Launch:
    """The process a placed unit runs (render.argv decides its argv and environment)."""
    if p.role in ("router", "fallback"):
        return replace(launch(dep, p.role, tools), unit=p.unit)
    server = server_named(dep, p.name)
    assert server is not None  # the placement made p from it
    return node_launch(dep, Node(server, p.node_rank), tools)


def _render(dep: Deployment, placement: Placement, p: Placed, run: Launch, config_path: str,
            tools: Toolchain) -> Unit:
    sections = [("Unit", _unit_section(dep, placement, p, _describe(dep, placement, p, run))),
                ("Service", _service_section(dep, placement, p, run, config_path, tools))]
    sections += install_sections(dep, p.role)
    return Unit(p.unit, render_ini(sections, unit_header(dep)))


def render_unit(dep: Deployment, run: Launch, config_path: str, tools: Toolchain) -> Unit:
    """The unit of one launch (its unit name places it)."""
    placement = place(dep)
    p = placement.unit(run.unit)
    if p is None:
        raise ValueError(f"{run.unit} is no unit of deployment {dep.name}")
    return _render(dep, placement, p, run, config_path, tools)


def render_units(dep: Deployment, tools: Toolchain, config_path: str, host: str = IMPLIED_HOST) -> list[Unit]:
    """The units of `host` (a single-host file: its one, implied host), or a ConfigError naming the input
    that cannot be rendered exactly (the loader refuses such deployment values first; the config path and
    the tool paths come from flags too) or the host that is not the deployment's."""
    placement = place(dep)
    if host not in placement.hosts:
        raise ConfigError([Problem("--host", host, f"is not a host of deployment {dep.name}",
                                   f"use one of: {', '.join(placement.hosts)}")], "render")
    return exactly(config_path, lambda: [_render(dep, placement, p, placed_launch(dep, p, tools), config_path, tools)
                                         for p in placement.on(host)])
