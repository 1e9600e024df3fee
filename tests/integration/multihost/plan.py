"""What runs on which host of the multi-host tier: each process's host, role, argv, environment and URL,
and each host's firewall file, taken from pdserve's own rendering (never written by the test).

Topology of the tier: one router host and two prefill and two decode hosts, so that every request
crosses links twice (router -> prefill, router -> decode) and every KV hand-off once (decode ->
prefill's bootstrap port), and every role keeps a worker when one host goes away.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdserve.render.argv import launches
from pdserve.render.toolchain import Toolchain
from pdserve.schema.loading import deployment_from_data

MODEL = "standin"
ROUTER_PORT = 30080
ROUTER_METRICS_PORT = 29080
PREFILL_PORT = 30100
DECODE_PORT = 30200
BOOTSTRAP_PORT = 8998
# A link cut leaves the router's health check waiting for an answer that never comes: this bounds
# each check (pdserve's default, 30 s, is sized for a loaded GPU server's slow /health).
HEALTH_CHECK_TIMEOUT_SECS = 3

# host name -> address on the cluster network (tests/fixtures/multihost_net.py makes one namespace each).
ADDRESSES = {
    "router": "10.77.0.10",
    "prefill-a": "10.77.0.11",
    "prefill-b": "10.77.0.12",
    "decode-a": "10.77.0.21",
    "decode-b": "10.77.0.22",
}
NETWORK = "10.77.0.0/24"


@dataclass(frozen=True)
class Process:
    host: str
    role: str  # prefill, decode or router
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str

    @property
    def name(self) -> str:
        return f"{self.role}@{self.host}"


@dataclass(frozen=True)
class Plan:
    addresses: dict[str, str]
    processes: tuple[Process, ...]
    firewalls: dict[str, Path] = field(default_factory=dict)  # host -> nftables file rendered for it
    source: str = ""  # how the plan was rendered, for the test log

    def on(self, host: str) -> list[Process]:
        return [p for p in self.processes if p.host == host]

    def role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    @property
    def router(self) -> Process:
        (router,) = self.role("router")
        return router

    def hosts_of(self, role: str) -> list[str]:
        return sorted({p.host for p in self.role(role)})


def _pair_deployment(prefill_host: str, decode_host: str) -> dict[str, Any]:
    """A single-host deployment file whose prefill, decode and router listen on three hosts' addresses."""
    return {
        "name": "mh",
        "model": {"path": "/models/standin", "served_name": MODEL, "context_length": 32768},
        "prefill": {"gpus": [0], "host": ADDRESSES[prefill_host], "allow_non_loopback": True, "port": PREFILL_PORT,
                    "mem_fraction_static": 0.8},
        "decode": {"gpus": [1], "host": ADDRESSES[decode_host], "allow_non_loopback": True, "port": DECODE_PORT,
                   "mem_fraction_static": 0.8},
        "transfer": {"backend": "nixl", "bootstrap_port": BOOTSTRAP_PORT},
        "router": {"host": ADDRESSES["router"], "port": ROUTER_PORT, "prometheus_host": ADDRESSES["router"],
                   "prometheus_port": ROUTER_METRICS_PORT, "health_check_timeout_secs": HEALTH_CHECK_TIMEOUT_SECS,
                   "worker_startup_timeout_secs": 120, "request_timeout_secs": 60},
        "fallback": {"gpus": [0, 1]},
    }


def from_single_host_renders() -> Plan:
    """Interim, until `pdserve render --host` exists: one single-host deployment per prefill/decode pair,
    each rendered by pdserve's `launches`; the router is pair a's, given pair b's workers too."""
    tools = Toolchain(sglang_python=sys.executable, numactl="/usr/bin/numactl", pdserve="pdserve")
    processes: list[Process] = []
    router_argv: list[str] = []
    for index, (prefill_host, decode_host) in enumerate((("prefill-a", "decode-a"), ("prefill-b", "decode-b"))):
        dep = deployment_from_data(_pair_deployment(prefill_host, decode_host), f"pair {index}").deployment
        launch = launches(dep, tools)
        for role, host in (("prefill", prefill_host), ("decode", decode_host)):
            processes.append(Process(host, role, launch[role].argv, dict(launch[role].env), launch[role].url))
        if index == 0:
            router_argv = list(launch["router"].argv)
            router_url = launch["router"].url
        else:
            at = router_argv.index("--host")
            router_argv[at:at] = ["--prefill", launch["prefill"].url, str(BOOTSTRAP_PORT),
                                  "--decode", launch["decode"].url]
    processes.append(Process("router", "router", tuple(router_argv), {}, router_url))
    return Plan(dict(ADDRESSES), tuple(processes), source="single-host renders (interim)")
