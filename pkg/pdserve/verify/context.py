"""What several of the verifier's checks read of the host, once per run and bounded by its options.

The pure checks (pdserve.verify.checks) never read the host; their gatherers (pdserve.verify.registry)
call pdserve.probes, and go through this context for what more than one of them needs: whether systemd
can be asked at all, a unit's state, the API key, a worker's processes, the journal, HTTP with the
run's client, and the metrics read before the first end-to-end request with the count of the requests
sent (the metrics checks compare the counters after them with these).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import httpx

from pdserve.probes import cgroups, http, journal, procs
from pdserve.probes import metrics as metrics_probe
from pdserve.probes.credentials import CredentialError, read_key
from pdserve.probes.journal import InvocationScan  # by name: the method `journal` below hides the module
from pdserve.probes.observations import HttpObs, Unavailable
from pdserve.probes.systemctl import Systemctl, SystemctlError, UnitState, service, unavailable_reason
from pdserve.schema.config import Deployment
from pdserve.schema.derived import API_KEY_CREDENTIAL
from pdserve.schema.topology import IMPLIED_HOST
from pdserve.verify.expect import Expectations, WorkerExpectation

JOURNAL_LINES = 15


@dataclass
class Options:
    probe_timeout: float = 10.0
    chat_timeout: float = 180.0
    api_key_file: str | None = None  # overrides router.api_key_file for reading the key
    rerun: str = "pdserve verify"  # the command line a host-local check of another host names


@dataclass
class Context:
    dep: Deployment
    exp: Expectations
    options: Options
    client: httpx.Client
    systemctl: Systemctl | None = None  # None: this host's systemctl, bounded by the probe timeout
    # The host this run stands on: its host-local checks (systemd, the journal, NVML, processes, NUMA)
    # are made; another host's are skipped naming it (pdserve.verify.hosts). IMPLIED_HOST on one host.
    here: str = IMPLIED_HOST
    _systemd_reason: str | None = field(default=None, init=False)
    _systemd_checked: bool = field(default=False, init=False)
    # Set by the runner when a selected check compares counters before and after the end-to-end checks.
    wants_metrics_baseline: bool = False
    metrics_baseline: dict[str, metrics_probe.MetricsObs] | None = field(default=None, init=False)
    e2e_requests: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.systemctl is None:
            self.systemctl = Systemctl(timeout=self.options.probe_timeout)

    def local(self) -> Expectations:
        """The expectations with only the worker processes of this host (on one host: all of them)."""
        return replace(self.exp, workers=self.exp.on(self.here))

    def systemd_reason(self) -> str | None:
        if not self._systemd_checked:
            self._systemd_reason, self._systemd_checked = unavailable_reason(), True
        return self._systemd_reason

    def require_systemd(self) -> None:
        reason = self.systemd_reason()
        if reason:
            raise Unavailable(reason)

    def unit_state(self, unit: str) -> UnitState:
        """One unit as systemd reports it; Unavailable when systemd cannot be asked."""
        self.require_systemd()
        assert self.systemctl is not None
        try:
            return self.systemctl.show([unit])[service(unit)]
        except SystemctlError as exc:
            raise Unavailable(str(exc)) from None

    def get(self, url: str, headers: dict[str, str] | None = None) -> HttpObs:
        return http.get(self.client, url, headers)

    def api_key(self) -> tuple[str | None, str | None]:
        """(key, error reading it); (None, None) when no key is configured. --api-key-file names the file
        itself; the configured one may arrive as the unit's systemd credential instead."""
        override = self.options.api_key_file
        path = override or self.exp.api_key_file
        if not path:
            return None, None
        try:
            return read_key(path, None if override else API_KEY_CREDENTIAL), None
        except CredentialError as exc:
            return None, str(exc)

    def worker_pids(self, w: WorkerExpectation) -> set[int]:
        """A worker's processes: its unit's cgroup under systemd, else the listener on its port and its children."""
        if not self.systemd_reason():
            try:
                group = self.unit_state(w.unit).control_group
            except Unavailable:
                group = ""
            if group:
                pids = set(cgroups.cgroup_pids(group))
                if pids:
                    return pids
        roots = procs.listening_pids(w.port)
        return procs.with_descendants(roots) if roots else set()

    def journal(self, unit: str, lines: int = JOURNAL_LINES) -> list[str]:
        return journal.journal(unit, lines, self.options.probe_timeout)

    def grep_journal(self, unit: str, needle: str) -> list[str]:
        return journal.grep_journal(unit, needle, self.options.probe_timeout)

    def grep_invocation(self, state: UnitState, needle: str) -> InvocationScan:
        """Lines of the unit's current invocation that contain `needle`, from its first line; none when
        systemd names no invocation (never started)."""
        if not state.invocation_id:
            return journal.InvocationScan(())
        return journal.grep_invocation(state.invocation_id, needle, self.options.probe_timeout)

    def metrics(self, role: str) -> metrics_probe.MetricsObs:
        """A role's /metrics (the router's: its Prometheus listener), bounded in size and time."""
        return metrics_probe.read(self.client, self.exp.metrics_urls[role], self.options.probe_timeout)

    def before_e2e_request(self) -> None:
        """Called before each end-to-end request: the first one reads every role's metrics first."""
        if self.wants_metrics_baseline and self.metrics_baseline is None:
            self.metrics_baseline = {role: self.metrics(role) for role in self.exp.metrics_urls}
        self.e2e_requests += 1
