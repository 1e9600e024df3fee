"""One host goes away under load, and comes back: the real router (smg 1.13.0) marks that host's worker
unhealthy, the other host of the same role keeps serving, and the host serves again once it is back.

Three faults, the first two each on a prefill host and on a decode host:
- power off: the host's link goes down, then every process on it is killed (in that order, so no FIN
  or RST reaches the router: a powered-off machine sends nothing); back = link up and its processes
  started again, as its units would be at boot;
- link cut: the host's link goes down, its processes keep running; back = link up;
- hang (on a decode host): every process on it stopped (SIGSTOP), the link up: its kernel still accepts
  connections and nothing answers on them; back = SIGCONT.

Load: RATE chat requests per second from the client (the root namespace) to the router
(tests/fixtures/loadgen.py), each with a REQUEST_TIMEOUT. The router's view is sampled every 0.25 s
from its own Prometheus port (`smg_worker_health{worker=URL}`). What is asserted is causal: the router
marks exactly the host's workers unhealthy; every request sent after that sample succeeds (the rest
serve them) until the host is back and after; what failed failed with an error the client sees (none
silent), and only requests sent before the router had marked the host; the host's worker is taken back,
answers requests again and keeps answering those routed to it after its return. The timings are printed
as a table in the terminal summary, not asserted.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.multihost.cluster import Cluster, HealthWatch, wait_for
from tests.integration.multihost.conftest import HOST_FAILURE_HEADER, HOST_FAILURE_ROWS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))

from loadgen import Load, Outcome

pytestmark = pytest.mark.integration

RATE = 10.0  # requests per second
REQUEST_TIMEOUT = 20.0
BASELINE_SECONDS = 3.0  # load before the fault
# How long the host stays away after the router marked it: requests in this window can only be
# served by the rest.
OUTAGE_AFTER_MARKED = 4.0
DETECT_TIMEOUT = 60.0
BACK_TIMEOUT = 120.0
TAIL_SECONDS = 3.0  # load after the host served again: it must answer requests in it
# What a client may see for a request that the router had sent to the host as it went away.
CUT_OFF = {"timeout", "HTTP 500", "HTTP 502", "HTTP 503", "HTTP 504", "connection closed mid-request"}

COLUMNS = (f"{'fault':<10} {'host':<10} {'sent':>5} {'outage ok':>9} {'failed':>6} {'after mark ok/failed':>20} "
           f"{'unhealthy s':>11} {'taken back s':>12} {'serving s':>9}  failures by cause")


@dataclass(frozen=True)
class Figures:
    fault: str
    host: str
    sent: int
    outage_ok: int
    outage_failed: int
    after_mark_ok: int
    after_mark_failed: int
    unhealthy_s: float
    readmitted_s: float
    serving_again_s: float
    causes: dict[str, int]

    def row(self) -> str:
        causes = ", ".join(f"{n} {c}" for c, n in sorted(self.causes.items(), key=lambda kv: -kv[1])) or "-"
        return (f"{self.fault:<10} {self.host:<10} {self.sent:>5} {self.outage_ok:>9} {self.outage_failed:>6} "
                f"{f'{self.after_mark_ok}/{self.after_mark_failed}':>20} {self.unhealthy_s:>11.1f} "
                f"{self.readmitted_s:>12.1f} {self.serving_again_s:>9.1f}  {causes}")


def record(capsys, cluster: Cluster, figures: Figures, note: str) -> None:
    if not HOST_FAILURE_HEADER:
        router = cluster.plan.dep.router
        HOST_FAILURE_HEADER.extend([
            f"{RATE:g} chat req/s through the router, client timeout {REQUEST_TIMEOUT:g} s; router health checks every "
            f"{router.health_check_interval_secs} s, timeout {router.health_check_timeout_secs} s; outage held "
            f"{OUTAGE_AFTER_MARKED:g} s after the router marked the host; seconds from the fault until the router "
            "marked it (unhealthy), from the host's return until the router marked it healthy (taken back) and until "
            "its server answered a request again (serving; one held through the outage counts)",
            COLUMNS])
    HOST_FAILURE_ROWS.append(figures.row())
    HOST_FAILURE_ROWS.append(f"{'':<22}{note}")
    with capsys.disabled():
        print(f"\n{COLUMNS}\n{figures.row()}\n{'':<22}{note}")


def _between(outcomes: list[Outcome], begin: float, end: float) -> list[Outcome]:
    return [o for o in outcomes if begin <= o.start < end]


def served_since(cluster: Cluster, host: str, baseline: dict[str, float]) -> bool:
    """Every worker on `host` answered more requests than `baseline` (its count before)."""
    for process in cluster.plan.on(host):
        count = cluster.served(process)
        if count is None or count <= baseline[process.name]:
            return False
    return True


FAULTS = {
    "power off": (Cluster.power_off, Cluster.power_on),
    "link cut": (Cluster.cut, Cluster.mend),
    "hang": (Cluster.freeze, Cluster.thaw),
}
# (fault, host) in the order they run: each fault on a decode and a prefill host.
HOST_FAULTS = [("power off", "decode-b"), ("link cut", "prefill-a"), ("power off", "prefill-b"),
               ("link cut", "decode-a"), ("hang", "decode-b")]


@dataclass(frozen=True)
class HostFaultRun:
    """One host fault under load, as measured (nothing asserted): what the test checks and the benchmark
    (tests/integration/router_compare) tabulates."""

    figures: Figures
    role: str
    outcomes: list[Outcome]  # every request of the run, by start
    fault_at: float
    marked_at: float
    marked_sample: dict[str, float]  # the router's worker health when it had marked the host
    rest: list[str]  # URLs of the other servers' heads
    rest_served: dict[str, float]  # requests each other server answered in OUTAGE_AFTER_MARKED after the mark
    rest_roles: dict[str, str]  # their roles, by name
    kept_serving: bool  # the host's servers answered requests in the TAIL_SECONDS after serving again

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def note(self) -> str:
        return (f"{self.role} on {self.figures.host}; the rest served {sum(self.rest_served.values()):g} requests in "
                f"the {OUTAGE_AFTER_MARKED:g} s after the mark ({self.rest_served})")


def host_fault_under_load(cluster: Cluster, fault: str, host: str) -> HostFaultRun:
    """`fault` on `host` while RATE requests/s go through the router: the fault, the router's mark, the
    outage held OUTAGE_AFTER_MARKED s, the host back, taken back by the router and serving again."""
    cluster.wait_serving()
    plan = cluster.plan
    away = [p.url for p in plan.on(host)]
    rest = [p for p in plan.heads if p.host != host]
    (role,) = {p.role for p in plan.on(host)}
    go, come_back = FAULTS[fault]

    back_at = None
    with HealthWatch(cluster) as watch:
        load = Load(plan.router.url, rate=RATE, duration=300, timeout=REQUEST_TIMEOUT,
                    model=plan.dep.model.served_name or plan.dep.model.path, headers=cluster.headers).start()
        try:
            time.sleep(BASELINE_SECONDS)
            at_fault = {p.name: cluster.served(p) or 0.0 for p in plan.on(host)}
            fault_at = time.monotonic()
            go(cluster, host)
            marked_at = float(wait_for(lambda: watch.first(fault_at, away, 0.0), DETECT_TIMEOUT,
                                       f"the router to mark {host}'s worker unhealthy"))
            rest_at_mark = {p.name: cluster.served(p) or 0.0 for p in rest}
            time.sleep(OUTAGE_AFTER_MARKED)
            rest_served = {p.name: (cluster.served(p) or 0.0) - rest_at_mark[p.name] for p in rest}
            back_at = time.monotonic()
            come_back(cluster, host)
            readmitted_at = float(wait_for(lambda: watch.first(back_at, away, 1.0), BACK_TIMEOUT,
                                           f"the router to take {host}'s worker back\n{cluster.diagnostics()}"))
            # A power-off restarts the processes: their counts begin at 0 again.
            baseline = {name: 0.0 if fault == "power off" else n for name, n in at_fault.items()}
            wait_for(lambda: served_since(cluster, host, baseline), BACK_TIMEOUT,
                     f"{host}'s worker to answer requests again")
            serving_at = time.monotonic()
            # What it answers from now on was routed to it after it came back (a request held through the
            # outage was answered by now): it must keep answering.
            at_serving = {p.name: cluster.served(p) or 0.0 for p in plan.on(host)}
            time.sleep(TAIL_SECONDS)
            kept_serving = served_since(cluster, host, at_serving)
        finally:
            load.stop()
            if back_at is None:  # the run failed with the host away: bring it back for the next one
                come_back(cluster, host)
    marked_sample = next(h for at, h in watch.samples if at == marked_at)

    outcomes = sorted(load.outcomes, key=lambda o: o.start)
    outage = _between(outcomes, fault_at, back_at)
    after_mark = _between(outcomes, marked_at, float("inf"))
    causes: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            causes[o.cause] = causes.get(o.cause, 0) + 1
    figures = Figures(fault, host, len(outcomes), sum(o.ok for o in outage), sum(not o.ok for o in outage),
                      sum(o.ok for o in after_mark), sum(not o.ok for o in after_mark),
                      marked_at - fault_at, readmitted_at - back_at, serving_at - back_at, causes)
    return HostFaultRun(figures, role, outcomes, fault_at, marked_at, marked_sample, [p.url for p in rest],
                        rest_served, {p.name: p.role for p in rest}, kept_serving)


@pytest.mark.parametrize(("fault", "host"), HOST_FAULTS)
def test_a_host_away_is_marked_unhealthy_the_rest_serve_and_it_serves_again(cluster, capsys, fault, host):
    run = host_fault_under_load(cluster, fault, host)
    figures, fault_at = run.figures, run.fault_at
    record(capsys, cluster, figures, run.note)

    # The router marked the host's worker, and only it.
    assert all(run.marked_sample.get(url) == 1.0 for url in run.rest), run.marked_sample
    # The rest kept serving: every request sent after the mark succeeded, the host away or back, and the
    # other worker of the same role answered requests meanwhile.
    assert figures.after_mark_failed == 0, [f"{o.start - fault_at:.1f} s: {o.cause} {o.detail}"
                                            for o in run.failures if o.start >= run.marked_at]
    assert figures.after_mark_ok > 0
    assert run.kept_serving, f"{host}'s server answered nothing in the {TAIL_SECONDS:g} s after it answered again"
    assert sum(n for name, n in run.rest_served.items() if run.rest_roles[name] == run.role) > 0, run.rest_served
    # What failed was sent to the host as it went away, and the client saw an error (nothing silent).
    assert set(figures.causes) <= CUT_OFF, figures.causes
    assert all(fault_at - REQUEST_TIMEOUT <= o.start < run.marked_at for o in run.failures), \
        [f"{o.start - fault_at:.1f} s: {o.cause}" for o in run.failures]
