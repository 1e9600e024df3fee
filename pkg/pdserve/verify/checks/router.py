"""The router: ready with every worker healthy, and registered with exactly the configured workers.

The router's /readiness is smg's: 200 with the worker counts once a Ready prefill AND a Ready decode exist,
else 503 with a reason ("insufficient healthy workers", or "draining" after SIGTERM). pdserve wants more
than a pair: every configured worker healthy. Both checks also read each worker's own /health: the router's
view is only as fresh as its last health check (router.health_check_interval_secs; smg's own default is a
minute), so "2/2 healthy" from the router alone can describe a worker that is already down.
"""

from __future__ import annotations

from pdserve.probes.answers import Mismatch, Workers, fit
from pdserve.probes.observations import HttpObs
from pdserve.probes.router import worker_counts
from pdserve.verify.expect import Expectations
from pdserve.verify.result import CheckResult, failed, passed


def check_readiness(exp: Expectations, readiness: HttpObs, workers_health: dict[str, HttpObs]) -> CheckResult:
    cid = "router.readiness"
    count = len(exp.servers)  # one prefill and one decode on one host; every server of a multi-host file
    expected = f"{exp.router_url}/readiness: 200 with {count}/{count} workers healthy"
    if readiness.status is None or readiness.error:
        return failed(cid, readiness.describe(), expected,
                      f"the router is not listening: `systemctl status {exp.router_unit}`; "
                      f"`journalctl -u {exp.router_unit} -n 100`" if readiness.status is None else
                      f"the answer on the router's port is not the router's (smg): `systemctl cat {exp.router_unit}` "
                      f"and `ss -ltnp` name what listens there")
    counts = worker_counts(readiness.body, f"{exp.router_url}/readiness")
    if isinstance(counts, Mismatch):
        return failed(cid, counts.observed, f"{expected}; {counts.expected}",
                      f"the answer on the router's port is not smg {exp.router_version}'s: see "
                      f"versions.router; `journalctl -u {exp.router_unit} -n 100`")
    healthy, total = counts.healthy_workers, counts.total_workers
    if healthy is None and isinstance(readiness.body, dict):
        # smg answers 503 with {"status": "not ready", "reason": ...} and no counts.
        observed = f"/readiness {readiness.status}: {counts.reason or counts.status}"
    else:
        observed = f"/readiness {readiness.status}, {healthy}/{total} workers healthy"
    down = {role: obs for role, obs in workers_health.items() if not obs.ok}
    details = [f"{role} /health: {obs.describe()}" for role, obs in workers_health.items()]
    if readiness.status == 200 and healthy == total == count:
        if not down:
            return passed(cid, observed, expected)
        return failed(cid, f"{observed} by the router's last health check, but {_down(down)}", expected,
                      _stale_view_fix(exp, down), details)
    if down:
        why = "; ".join(f"{role} {obs.describe()}" for role, obs in down.items())
        return failed(cid, f"{observed}; not healthy: {why}", expected,
                      "the router waits for its workers: " + "; ".join(
                          f"check `journalctl -u {exp.workers[r].unit}` (a model load takes minutes: a refused "
                          f"connection or 503 means still starting)" for r in down) +
                      "; the router takes a worker in once its /health answers, however late", details)
    # smg keeps trying to register a worker it found down at start (a worker that came up 50 s after the
    # router, past --worker-startup-timeout-secs, was taken in 12 s later in the integration tier), and it
    # takes a worker back after router.health_success_threshold good health checks: this state passes.
    every = "both workers answer" if count == 2 else f"all {count} workers answer"
    return failed(cid, f"{observed}, although {every} /health 200", expected,
                  "the router has not taken the workers in yet: it registers a late worker within about 30 s and "
                  "re-admits one after router.health_success_threshold health checks (every "
                  "router.health_check_interval_secs); run verify with --wait 60; if it persists, "
                  f"`journalctl -u {exp.router_unit} -n 100` and `systemctl restart {exp.router_unit}`", details)


def _down(down: dict[str, HttpObs]) -> str:
    return "; ".join(f"{role} /health: {obs.describe()}" for role, obs in down.items())


def _stale_view_fix(exp: Expectations, down: dict[str, HttpObs]) -> str:
    units = " ".join(exp.workers[r].unit for r in down)
    return (f"the worker is down although the router has not noticed yet (it checks every "
            f"router.health_check_interval_secs): `systemctl status {units}`, `journalctl -u "
            f"{' -u '.join(exp.workers[r].unit for r in down)} -n 100`; systemd restarts a crashed worker "
            "(Restart=on-failure) and the router takes it back once its /health answers")


def check_workers(exp: Expectations, workers: HttpObs, workers_health: dict[str, HttpObs] | None = None) -> CheckResult:
    cid = "router.workers"
    want = {w.url: (w.role, w.bootstrap_port if w.role == "prefill" else None) for w in exp.servers.values()}
    expected = "; ".join(f"{kind} {url}" + (f" bootstrap {port}" if port else "")
                         for url, (kind, port) in want.items())
    if not workers.ok:
        return failed(cid, workers.describe(), expected,
                      f"the router's /workers did not answer; `journalctl -u {exp.router_unit} -n 100`")
    listed = fit(Workers, workers.body, f"{exp.router_url}/workers")
    if isinstance(listed, Mismatch):
        return failed(cid, listed.observed, f"{expected}; {listed.expected}",
                      f"the answer on the router's port is not smg {exp.router_version}'s: see "
                      f"versions.router; `journalctl -u {exp.router_unit} -n 100`")
    seen: dict[str, tuple[str, int | None, bool]] = {}
    for w in listed.workers:
        seen[w.url.rstrip("/")] = (str(w.worker_type), w.bootstrap_port, w.is_healthy)
    observed = "; ".join(f"{kind} {url}" + (f" bootstrap {port}" if port else "") + ("" if ok else " (unhealthy)")
                         for url, (kind, port, ok) in sorted(seen.items())) or "no workers"
    problems = []
    for url, (kind, port) in want.items():
        if url not in seen:
            problems.append(f"{kind} {url} is not registered")
            continue
        got_kind, got_port, healthy = seen[url]
        if got_kind != kind:
            problems.append(f"{url} is registered as {got_kind}, configured as {kind}")
        if port is not None and got_port != port:
            problems.append(f"prefill {url} has bootstrap port {got_port}, configured {port}")
        if not healthy:
            problems.append(f"{kind} {url} is marked unhealthy by the router")
    for url in seen.keys() - want.keys():
        problems.append(f"{url} is registered but not in the deployment")
    if problems:
        return failed(cid, observed, expected,
                      "the router's flags disagree with the deployment: re-render the units "
                      f"(`pdserve render`) and `systemctl restart {exp.router_unit}`", problems)
    down = {role: obs for role, obs in (workers_health or {}).items() if not obs.ok}
    if down:
        return failed(cid, f"{observed}, but {_down(down)}", expected, _stale_view_fix(exp, down),
                      [f"{role} /health: {obs.describe()}" for role, obs in down.items()])
    return passed(cid, observed, expected)
