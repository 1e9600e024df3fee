"""What runs on which host of a multi-host deployment, as pdserve renders it (never written by the test):
`pdserve render --host NAME` (the real CLI) writes each host's units and nftables ruleset, and
`pdserve.render.argv.host_launches` gives the argv and environment of each unit's process, which the tier
starts inside that host's network namespace (checked against the unit files: the same units, each one's
ExecStart= the same argv).
"""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.render.argv import host_launches
from pdserve.render.firewall import firewall_filename
from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import Deployment
from pdserve.schema.loading import load
from pdserve.schema.topology import Server, host_address, host_names, servers

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# The tier's own deployment (two servers per role on four hosts, the router on a fifth) and the examples.
OWN = HERE / "deployment.toml"
EXAMPLES = {"two-host": REPO / "hosts/two-host/deployment.toml", "four-host": REPO / "hosts/four-host/deployment.toml"}
RENDER_TIMEOUT = 60


@dataclass(frozen=True)
class Process:
    host: str
    role: str  # prefill, decode or router
    unit: str
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str  # how other hosts reach its HTTP port (a router listening on 0.0.0.0: at its host's address)
    server: str | None = None  # the server it is a node of (None: the router)
    node_rank: int = 0
    credentials: dict[str, str] = field(default_factory=dict)  # systemd credential name -> file

    @property
    def name(self) -> str:
        return f"{self.server or self.role}@{self.host}" if self.node_rank == 0 else \
            f"{self.server}-node{self.node_rank}@{self.host}"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def flag(self, name: str) -> str | None:
        """The value of `name` in its argv (the last one given), or None."""
        at = [i for i, arg in enumerate(self.argv) if arg == name]
        return self.argv[at[-1] + 1] if at else None


@dataclass(frozen=True)
class Plan:
    dep: Deployment
    source: Path
    addresses: dict[str, str]
    processes: tuple[Process, ...]
    firewalls: dict[str, Path]  # host -> the nftables file `render --host` wrote for it
    units: dict[str, Path]  # host -> the directory `render --host` wrote its units to

    def on(self, host: str) -> list[Process]:
        return [p for p in self.processes if p.host == host]

    def role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    @property
    def router(self) -> Process:
        (router,) = self.role("router")
        return router

    @property
    def heads(self) -> list[Process]:
        """The servers' node-0 processes: the ones with the HTTP API the router uses."""
        return [p for p in self.processes if p.role != "router" and p.node_rank == 0]

    def hosts_of(self, role: str) -> list[str]:
        return sorted({p.host for p in self.role(role)})

    def servers(self) -> list[Server]:
        return servers(self.dep)

    @property
    def network(self) -> str:
        """The /24 every host address is in (the test bridge's network)."""
        nets = {ipaddress.ip_network(f"{a}/24", strict=False) for a in self.addresses.values()}
        if len(nets) != 1:
            raise ValueError(f"{self.source}: the hosts' addresses are not in one /24: "
                             f"{sorted(self.addresses.values())}")
        return str(nets.pop())


def tools() -> Toolchain:
    python = sys.executable
    return Toolchain(sglang_python=python, numactl="/usr/bin/numactl", pdserve=str(Path(python).parent / "pdserve"))


def exec_start(unit: Path) -> list[str]:
    """The argv of a rendered unit's one ExecStart= line (pdserve writes no specifiers or variables there)."""
    (line,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def render(source: Path, out: Path) -> Plan:
    """Render every host of `source` with the real CLI into out/<host>/ and collect what each runs."""
    dep = load(source).deployment
    chain = tools()
    processes: list[Process] = []
    firewalls: dict[str, Path] = {}
    units: dict[str, Path] = {}
    # One `pdserve render --host` per host, side by side (each is a Python start: about 2 s).
    renders = {host: subprocess.Popen(
        [chain.pdserve, "render", "--host", host, "-c", str(source), "--out", str(out / host), "--sglang-python",
         chain.sglang_python, "--numactl", chain.numactl, "--pdserve", chain.pdserve],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for host in host_names(dep)}
    for host, proc in renders.items():
        try:
            _, stderr = proc.communicate(timeout=RENDER_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"pdserve render --host {host} -c {source} took over {RENDER_TIMEOUT} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"pdserve render --host {host} -c {source} failed ({proc.returncode}): {stderr}")
    for host in host_names(dep):
        directory = out / host
        firewalls[host], units[host] = directory / firewall_filename(dep), directory
        launches = host_launches(dep, host, chain)
        rendered = sorted(p.stem for p in directory.glob("*.service"))
        if rendered != sorted(launch.unit for launch in launches):
            raise RuntimeError(f"render --host {host} wrote units {rendered}, host_launches has "
                               f"{sorted(launch.unit for launch in launches)}")
        address = host_address(dep, host) or ""
        for launch in launches:
            unit_argv = exec_start(directory / f"{launch.unit}.service")
            if unit_argv != list(launch.argv):
                raise RuntimeError(f"{launch.unit} on {host}: the unit's ExecStart= is {unit_argv}, host_launches "
                                   f"gives {list(launch.argv)}")
            # A router on a wildcard address is reached at its host's cluster address from elsewhere.
            public = launch.role == "router" and dep.router.host in ("0.0.0.0", "::")
            url = f"http://{address}:{dep.router.port}" if public else launch.url
            processes.append(Process(host, launch.role, launch.unit, launch.argv, dict(launch.env), url,
                                     launch.server, launch.node_rank, dict(launch.credentials)))
    addresses = {host: host_address(dep, host) or "" for host in host_names(dep)}
    return Plan(dep, source, addresses, tuple(processes), firewalls, units)
