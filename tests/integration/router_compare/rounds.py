"""Each fault behind each router, in one loop both tiers share."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.integration.router_compare.report import FaultResult, Figures

Say = Callable[[str], None]


def alternating(faults: list[str], routers: dict[str, str], run: Callable[[str, str], Figures], say: Say,
                recover: Callable[[], None] = lambda: None) -> list[FaultResult]:
    """`run(fault, router)` for every fault and router. The routers' order alternates fault by fault, so that
    neither always meets the machine just after the other's run. A run that raises is kept as {"error": ...}
    and the rest still run, after `recover()` (put the deployment back into a known state)."""
    results = []
    for index, fault in enumerate(faults):
        order = list(routers) if index % 2 == 0 else list(reversed(routers))
        by_router: dict[str, Figures] = {}
        for router in order:
            say(f"{fault} behind {routers[router]}")
            began = time.monotonic()
            try:
                by_router[router] = run(fault, router)
            except Exception as exc:  # noqa: BLE001 - a fault that went wrong is a row that says so
                by_router[router] = {"error": f"{type(exc).__name__}: {exc}"[:1500]}
                say(f"  error: {by_router[router]['error'][:300]}")
                recover()
            say(f"  {time.monotonic() - began:.0f} s: {by_router[router].get('failed', '-')} failed")
        results.append(FaultResult(fault, by_router))
    return results
