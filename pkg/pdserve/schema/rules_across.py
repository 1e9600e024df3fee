"""Rules that relate several deployments on one host: no two may share a listening port or a unit name.

`pdserve.schema.rules` checks one deployment against itself; these check each deployment against the others,
as the NixOS module does at build time with one `pdserve check a.json b.json ...`. Ports count host-wide
(a listener on 0.0.0.0 takes the port on every address), so the same port in two deployments is a
collision whatever their hosts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pdserve.schema.config import Deployment, Role
from pdserve.schema.listeners import listeners as placed_listeners
from pdserve.schema.placement import IMPLIED_HOST, place
from pdserve.schema.problems import Problem


@dataclass(frozen=True)
class Listener:
    field: str
    port: int
    # Multi-host deployments: the cluster address of the host that binds it. "" is a single-host file's
    # one host; listeners of a single-host and a multi-host deployment are not compared (where the one
    # host sits among the other's hosts, no file says).
    address: str = ""


def listeners(dep: Deployment) -> list[Listener]:
    """Every port a deployment binds, per host (pdserve.schema.listeners), each port of a range on its own,
    at its host's cluster address ("" for a single-host file's one host). The fallback counts only where it
    has a port of its own: by default it takes the router's, which is the same deployment's and never runs
    beside it."""
    addresses = {IMPLIED_HOST: "", **{name: host.address for name, host in dep.hosts.items()}}
    return [Listener(item.field, port, addresses[item.host])
            for item in placed_listeners(dep) if item.host in addresses
            for port in range(item.first, item.last + 1)]


def unit_names(dep: Deployment) -> dict[str, Role]:
    """Every unit of the deployment, on every host, and the role it runs."""
    return {p.unit: p.role for p in place(dep).placed}


def colliding_ports(deployments: Sequence[Deployment]) -> Iterator[Problem]:
    taken: dict[tuple[str, int], tuple[int, str, str]] = {}
    for index, dep in enumerate(deployments):
        for listener in listeners(dep):
            owner = taken.setdefault((listener.address, listener.port), (index, dep.name, listener.field))
            if owner[0] != index:
                where = f"host {listener.address}" if listener.address else "one host"
                yield Problem(
                    f"{dep.name}: {listener.field}",
                    listener.port,
                    f"is already taken by deployment {owner[1]}'s {owner[2]}; two deployments on {where} "
                    "cannot listen on the same port",
                    f"give deployment {dep.name} a free port for {listener.field}",
                )


def colliding_units(deployments: Sequence[Deployment]) -> Iterator[Problem]:
    taken: dict[str, str] = {}
    for dep in deployments:
        units = unit_names(dep)
        clash = next((unit for unit in units if unit in taken), None)
        if clash is not None:
            yield Problem(
                f"{dep.name}: name",
                dep.name,
                f"gives unit {clash}.service, which deployment {taken[clash]} already has",
                "give each deployment a distinct name that is not another's name plus -prefill, -decode or "
                f"-router (e.g. name = \"{dep.name}2\")",
            )
        for unit in units:
            taken.setdefault(unit, dep.name)


def validate_across(deployments: Sequence[Deployment]) -> list[Problem]:
    return [*colliding_units(deployments), *colliding_ports(deployments)]
