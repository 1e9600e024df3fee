"""A Plan running on a cluster network: each process started inside its host's namespace with the
argv and environment pdserve rendered (the workers are the stand-in behind `python -m
sglang.launch_server`, the router is the real smg 1.13.0), and what the tests read from it:
the router's view of each worker (`smg_worker_health{worker=URL}` on its Prometheus port, read from
the router host), each worker's request and KV hand-off counters (read from the router host too, the
way the router reaches them), and the host faults: power off, power on, link cut, link mended.

Every wait is bounded; `stop()` kills every process on every host (tests/fixtures/multihost_net.py
removes the namespaces after it).
"""

from __future__ import annotations

import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from pdserve.probes import metrics
from tests.fixtures import waiting
from tests.fixtures.sampler import Sampler
from tests.integration.multihost.plan import Plan, Process

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from multihost_net import Net  # noqa: E402
from standin_sglang import make_shim  # noqa: E402
from standin_sglang.launch import env_with_fixtures  # noqa: E402

START_TIMEOUT = 120.0  # four stand-ins importing SGLang's argument parser at once on two cores


class ClusterError(RuntimeError):
    pass


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.25) -> object:
    return waiting.wait_for(predicate, timeout, what, interval, error=ClusterError)


def _get_status(url: str, timeout: float, headers: dict[str, str] | None = None) -> int | None:
    try:
        return httpx.get(url, timeout=timeout, headers=headers).status_code
    except httpx.HTTPError:
        return None


def _read_metrics(url: str, timeout: float) -> metrics.MetricsObs:
    with httpx.Client() as client:
        return metrics.read(client, url, timeout)


@dataclass
class Cluster:
    net: Net
    plan: Plan
    logs: Path
    shim: Path = field(init=False)
    # The router's API key where the deployment names one (api_key_file): made up for the test.
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def __post_init__(self) -> None:
        self.shim = make_shim(self.logs / "shim")

    @property
    def keyed(self) -> bool:
        return bool(self.plan.router.credentials)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.keyed else {}

    # -- processes ------------------------------------------------------------------------------

    def log(self, process: Process) -> Path:
        return self.logs / f"{process.unit}@{process.host}.log"

    def start(self, process: Process) -> None:
        env = env_with_fixtures(dict(process.env), first=[str(self.shim)])
        if process.credentials:
            # What systemd's LoadCredential= gives the unit: the key in $CREDENTIALS_DIRECTORY/<name>.
            credentials = self.logs / f"credentials-{process.unit}"
            credentials.mkdir(mode=0o700, exist_ok=True)
            for name in process.credentials:
                (credentials / name).write_text(self.api_key)
            env["CREDENTIALS_DIRECTORY"] = str(credentials)
        self.net[process.host].start(list(process.argv), self.log(process), env)

    def start_host(self, host: str) -> None:
        for process in self.plan.on(host):
            self.start(process)

    def start_all(self) -> None:
        for host in self.plan.addresses:
            self.start_host(host)

    def stop(self) -> None:
        for host in self.net.hosts.values():
            host.kill_all()

    def tail(self, process: Process, lines: int = 30) -> str:
        try:
            return "\n".join(self.log(process).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def diagnostics(self) -> str:
        return "\n".join(f"--- {p.name} {p.unit} ({p.url})\n{self.tail(p)}" for p in self.plan.processes)

    # -- views from the router host -------------------------------------------------------------

    @property
    def router_host(self):
        return self.net[self.plan.router.host]

    def status_from(self, host: str, url: str, timeout: float = 2.0,
                    headers: dict[str, str] | None = None) -> int | None:
        return self.net[host].call(_get_status, url, timeout, headers, timeout=timeout + 5)

    def metrics_from_router_host(self, url: str, timeout: float = 3.0) -> metrics.MetricsObs:
        return self.router_host.call(_read_metrics, url, timeout, timeout=timeout + 5)

    @property
    def router_metrics_url(self) -> str:
        argv = self.plan.router.argv
        host, port = argv[argv.index("--prometheus-host") + 1], argv[argv.index("--prometheus-port") + 1]
        return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/metrics"

    def worker_health(self) -> dict[str, float]:
        """The router's own view: worker URL -> smg_worker_health (1 healthy, 0 not); {} if unreadable."""
        obs = self.metrics_from_router_host(self.router_metrics_url)
        return {s.label("worker") or "": s.value for s in obs.series("smg_worker_health")}

    def served(self, process: Process, family: str = "sglang:num_requests_total") -> float | None:
        """A worker's own count of requests it answered (None: its /metrics did not answer)."""
        obs = self.metrics_from_router_host(f"{process.url}/metrics")
        if obs.status != 200:
            return None
        return metrics.total(obs, family) or 0.0

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Every server node answers /health (seen from its own host: a firewall may keep others out of
        a node's port), the router is ready and marks every server healthy."""
        for process in [p for p in self.plan.processes if p.role != "router"]:
            wait_for(lambda p=process: self.status_from(p.host, f"{p.url}/health") == 200, timeout,
                     f"{process.name} to answer /health at {process.url}\n{self.diagnostics()}", 0.5)
        router = self.plan.router
        wait_for(lambda: self.status_from(router.host, f"{router.url}/readiness", headers=self.headers) == 200, timeout,
                 f"the router at {router.url} to be ready\n{self.tail(router)}", 0.5)
        wanted = {p.url for p in self.plan.heads}
        wait_for(lambda: {u for u, v in self.worker_health().items() if v == 1.0} >= wanted, timeout,
                 f"the router to mark every worker healthy ({sorted(wanted)})", 0.5)

    # -- host faults ----------------------------------------------------------------------------

    def power_off(self, host: str) -> None:
        """Every process on the host killed and its link down: nothing answers, nothing refuses."""
        self.net[host].link(False)
        self.net[host].kill_all()

    def power_on(self, host: str) -> None:
        """The link back, then the host's processes started again (as its units would at boot)."""
        self.net[host].link(True)
        self.start_host(host)

    def freeze(self, host: str) -> None:
        """Every process on the host stopped (SIGSTOP), its link up: a hung machine. Its kernel still
        accepts connections; nothing answers on them."""
        self.net[host].signal_all(signal.SIGSTOP)

    def thaw(self, host: str) -> None:
        self.net[host].signal_all(signal.SIGCONT)

    def cut(self, host: str) -> None:
        self.net[host].link(False)

    def mend(self, host: str) -> None:
        self.net[host].link(True)


@dataclass
class HealthWatch(Sampler[dict[str, float]]):
    """Samples the router's worker health every `period` s on a thread: [(time, {url: health})]."""

    cluster: Cluster
    period: float = 0.25

    def read(self) -> dict[str, float]:
        try:
            return self.cluster.worker_health()
        except Exception:  # noqa: BLE001 - a read that failed is a gap in the samples, not a verdict
            return {}

    def keeps(self, reading: dict[str, float]) -> bool:
        return bool(reading)

    def first(self, since: float, urls: list[str], value: float) -> float | None:
        """The first sample at or after `since` in which every one of `urls` has health `value`."""
        for at, health in self.samples:
            if at >= since and all(health.get(u) == value for u in urls):
                return at
        return None
