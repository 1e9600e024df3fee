"""The systemd units of one host of a multi-host deployment. Pure: a deployment, a host and a toolchain in,
unit texts out, through the same rendering path as a single host's (render.units, schema.systemd_syntax).

After= means ready, as on one host, but systemd orders units of one host only. So:
- a server node's ExecStartPost= waits for its server's API (node 0, perhaps on another host): a node of
  a multi-node server counts as started once the whole server answers;
- the router Wants= and is After= the server units on its own host, and its ExecStartPre= gates wait for
  every server: briefly for those on its host (their start has ended), up to the servers' start timeout
  for those on other hosts, which load in parallel and which no ordering can wait for; the router's
  TimeoutStartSec= grows by that wait.
There is no fallback: a multi-host deployment has no single-server layout.
"""

from __future__ import annotations

from pdserve.render.argv import Launch, host_launches
from pdserve.render.toolchain import Toolchain
from pdserve.render.units import (
    READY_MARGIN_SEC,
    WORKER_GATE_SEC,
    Section,
    Unit,
    exactly,
    gate_credentials,
    install_sections,
    render_ini,
    service_section,
    unit_header,
    warm_start,
)
from pdserve.schema import systemd_syntax
from pdserve.schema.config import Deployment
from pdserve.schema.derived import ROUTER_START_TIMEOUT_SEC
from pdserve.schema.problems import ConfigError, Problem
from pdserve.schema.topology import (
    Server,
    host_names,
    nodes_on,
    router_hosts,
    router_unit,
    server_named,
    server_unit,
    servers,
)


def _gate(tools: Toolchain, config_path: str, server: Server, timeout: int, interval: str) -> list[str]:
    return [tools.pdserve, "wait-ready", server.role, "--server", server.name, "--config", config_path,
            "--timeout", str(max(timeout, 1)), "--interval", interval]


def _local(dep: Deployment, host: str) -> set[str]:
    """Names of the servers whose API (node 0) runs on `host`."""
    return {server.name for server in servers(dep) if server.hosts[0] == host}


def _describe(dep: Deployment, host: str, launch: Launch) -> str:
    if launch.role == "router":
        count = len(servers(dep))
        return f"pdserve {dep.name}: smg router (PD) on host {host}, {launch.url}, in front of {count} servers"
    server = server_named(dep, launch.server or "")
    assert server is not None  # host_launches made it from a server
    gpus = ",".join(str(g) for g in server.spec.gpus)
    numa = f", NUMA node {server.spec.numa_node}" if server.spec.numa_node is not None else ""
    node = f" node {launch.node_rank} of {server.nnodes}" if server.nnodes > 1 else ""
    return (f"pdserve {dep.name}: SGLang {server.role} server {server.name}{node} on host {host}, "
            f"GPUs {gpus}{numa}, {server.url}")


def _unit_section(dep: Deployment, host: str, launch: Launch, local_units: list[str]) -> Section:
    entries: Section = [("Description", systemd_syntax.text_value(_describe(dep, host, launch))),
                        ("Wants", "network-online.target")]
    if launch.role == "router" and local_units:
        # Not Requires=: a crashed server must not take the router (and the public port) down with it.
        workers = " ".join(f"{unit}.service" for unit in local_units)
        entries += [("Wants", workers), ("After", f"network-online.target {workers}")]
    else:
        entries.append(("After", "network-online.target"))
    return [*entries, ("StartLimitIntervalSec", str(dep.systemd.start_limit_interval_sec)),
            ("StartLimitBurst", str(dep.systemd.start_limit_burst))]


def _service(dep: Deployment, host: str, launch: Launch, config_path: str, tools: Toolchain) -> Section:
    load = dep.systemd.start_timeout_sec
    if launch.role != "router":
        server = server_named(dep, launch.server or "")
        assert server is not None
        ready = _gate(tools, config_path, server, load - READY_MARGIN_SEC, "2")
        gates: list[list[str]] = []
        credentials: dict[str, str] = {}
        if launch.node_rank == 0:
            # The server's API runs on node 0: its unit alone takes it out of the routers and warms it.
            gates, ready = warm_start(tools, config_path, server.role, ready, ["--server", server.name])
            credentials = gate_credentials(dep)
        return service_section(dep, launch, tools, start_timeout=load, gates=gates, ready=ready,
                               gate_credentials=credentials)
    here = _local(dep, host)
    gates = [_gate(tools, config_path, s, WORKER_GATE_SEC, "0.5") if s.name in here else
             _gate(tools, config_path, s, load - READY_MARGIN_SEC, "2") for s in servers(dep)]
    remote = any(s.name not in here for s in servers(dep))
    start_timeout = ROUTER_START_TIMEOUT_SEC + (load if remote else 0)
    ready = [tools.pdserve, "wait-ready", "router", "--config", config_path,
             "--timeout", str(ROUTER_START_TIMEOUT_SEC - READY_MARGIN_SEC)]
    return service_section(dep, launch, tools, start_timeout=start_timeout, gates=gates, ready=ready)


def render_host_unit(dep: Deployment, host: str, launch: Launch, config_path: str, tools: Toolchain,
                     local_units: list[str]) -> Unit:
    sections = [("Unit", _unit_section(dep, host, launch, local_units)),
                ("Service", _service(dep, host, launch, config_path, tools))]
    sections += install_sections(dep, launch.role)
    return Unit(launch.unit, render_ini(sections, unit_header(dep)))


def render_host_units(dep: Deployment, host: str, tools: Toolchain, config_path: str) -> list[Unit]:
    """The units of `host`: its server nodes and, where it runs one, its router; or a ConfigError."""
    if host not in dep.hosts:
        raise ConfigError([Problem("--host", host, f"is not a host of deployment {dep.name}",
                                   f"use one of: {', '.join(host_names(dep))}")], "render")
    runs = host_launches(dep, host, tools)
    local_units = [run.unit for run in runs if run.role != "router"]
    return exactly(config_path, lambda: [render_host_unit(dep, host, run, config_path, tools, local_units)
                                         for run in runs])


def host_unit_names(dep: Deployment, host: str) -> list[str]:
    """The unit names (without .service) `render --host` writes for `host`, in order."""
    names = [server_unit(dep, node) for node in nodes_on(dep, host)]
    return names + ([router_unit(dep, host)] if host in router_hosts(dep) else [])

