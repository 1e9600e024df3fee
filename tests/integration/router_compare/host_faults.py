"""The multi-host tier's host faults behind each router: one cluster of network namespaces
(tests/integration/multihost), the workers started once with their rendered argv; the router host runs
either the rendered router (smg) or the argv of the 0.3.2 drop-in over the rendered router unit (this tier
starts each unit's ExecStart= argv itself, so the drop-in is written beside the rendered unit and its
ExecStart= is what runs). The faults and measurements are the tier's own
(tests/integration/multihost/test_host_failure.py); nothing is asserted, every figure is kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.integration.multihost import plan as plans
from tests.integration.multihost.cluster import Cluster
from tests.integration.multihost.conftest import prerequisites as tier_prerequisites
from tests.integration.multihost.conftest import running
from tests.integration.multihost.test_host_failure import (
    BASELINE_SECONDS,
    HOST_FAULTS,
    OUTAGE_AFTER_MARKED,
    RATE,
    REQUEST_TIMEOUT,
    host_fault_under_load,
)
from tests.integration.router_compare.container_faults import LEGACY, SMG
from tests.integration.router_compare.legacy_router import DROPIN_NAME, exec_start_of, legacy_dropin
from tests.integration.router_compare.report import Figures, TierResult, failure_figures
from tests.integration.router_compare.rounds import Say, alternating


def use_router(cluster: Cluster, argv: tuple[str, ...]) -> None:
    """The router host's one process (the router) killed and started again with `argv`; then serving."""
    plan = cluster.plan
    router = dataclasses.replace(plan.router, argv=argv)
    cluster.plan = dataclasses.replace(plan, processes=tuple(router if p.role == "router" else p
                                                             for p in plan.processes))
    cluster.router_host.kill_all()
    cluster.start(router)
    cluster.wait_serving()


def host_fault(cluster: Cluster, fault: str, host: str) -> Figures:
    run = host_fault_under_load(cluster, fault, host)
    f = run.figures
    broken = [url for url in run.rest if run.marked_sample.get(url) != 1.0]
    return {"sent": f.sent, **failure_figures(run.outcomes), "after_mark_failed": f.after_mark_failed,
            "outage_ok": f.outage_ok, "outage_failed": f.outage_failed, "after_mark_ok": f.after_mark_ok,
            "marked_s": round(f.unhealthy_s, 3), "taken_back_s": round(f.readmitted_s, 3),
            "serving_again_s": round(f.serving_again_s, 3),
            "note": run.note + ("" if run.kept_serving else "; the host's server answered nothing after serving again")
                    + (f"; the router also marked {broken}" if broken else "")}


def run(work: Path, faults: list[tuple[str, str]], routers: dict[str, str], say: Say) -> TierResult:
    try:
        tier_prerequisites()
    except pytest.skip.Exception as skip:
        raise SystemExit(f"the multi-host tier cannot run here: {skip}") from None
    tier = TierResult("multihost", "host failures: multi-host tier (network namespaces on a bridge, stand-in workers)",
                      [f"{RATE:g} chat req/s through the router, client timeout {REQUEST_TIMEOUT:g} s, "
                       f"{BASELINE_SECONDS:g} s of load before the fault; the outage held {OUTAGE_AFTER_MARKED:g} s "
                       "after the router marked the host (smg_worker_health 0, read from its Prometheus port); the "
                       "same cluster and workers for both routers, which alternate in order fault by fault"],
                      routers)
    work.mkdir(parents=True, exist_ok=True)
    with running(plans.OWN, "c", work) as cluster:
        router = cluster.plan.router
        unit = cluster.plan.units[router.host] / f"{router.unit}.service"
        unit_text = unit.read_text()
        dropin = legacy_dropin(exec_start_of(unit_text), cluster.plan.dep)
        path = unit.parent / f"{unit.name}.d" / DROPIN_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dropin, encoding="utf-8")
        argvs = {SMG: tuple(exec_start_of(unit_text)), LEGACY: tuple(exec_start_of(dropin))}
        tier.settings.append(f"smg: the router's ExecStart= as rendered; 0.3.2: that of {unit.name}.d/{DROPIN_NAME}")
        tier.artifacts = {"router_unit": unit_text, "legacy_dropin": dropin}
        names = {f"{fault} {host}": (fault, host) for fault, host in faults}

        def run_one(name: str, router: str) -> Figures:
            use_router(cluster, argvs[router])
            return host_fault(cluster, *names[name])

        tier.faults += alternating(list(names), routers, run_one, lambda text: say(f"multihost: {text}"))
    return tier


ALL_HOST_FAULTS = list(HOST_FAULTS)
