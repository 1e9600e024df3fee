"""Who Prometheus scrapes for one deployment: one job per role, each with `role` and `deployment` labels."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.render.emit import prometheus
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import connect_address
from pdserve.schema.placement import place

SCRAPED_ROLES: tuple[Role, ...] = ("prefill", "decode", "router", "fallback")


@dataclass(frozen=True)
class Target:
    role: Role
    job: str
    address: str  # host:port as a scraper on this host reaches it (pdserve.render.emit.prometheus.target)

    def labels(self, dep: Deployment) -> dict[str, str]:
        return prometheus.labels({"deployment": dep.name, "role": self.role})


def job_name(dep: Deployment, role: Role) -> str:
    return f"pdserve-{dep.name}-{role}"


def targets(dep: Deployment) -> list[Target]:
    """The router's Prometheus listener (not its API port), the two workers' and the fallback's /metrics.
    The fallback has its own job: it answers only while it serves, and its `up` says which layout runs."""
    # One server per role: monitoring renders for one host (rules refuse it on several).
    servers: dict[str, tuple[str, int]] = {}
    for placed in place(dep).of_role("prefill", "decode"):
        servers.setdefault(placed.role, (placed.listen_host, placed.port))
    where = {
        **servers,
        "router": (dep.router.prometheus_host, dep.router.prometheus_port),
        "fallback": (dep.fallback_host, dep.fallback_port),
    }
    return [Target(role, job_name(dep, role), prometheus.target(connect_address(where[role][0]), where[role][1]))
            for role in SCRAPED_ROLES]
