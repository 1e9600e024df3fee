"""Which host of a multi-host deployment a verify run stands on (whose host-local checks it makes). Pure:
the machine's addresses come in from pdserve.probes.net.

`--host NAME` decides. Without it: the host whose cluster address is one of this machine's addresses;
when none (or several) is, the first router host, since verify is meant to run there and it reaches
every server over the cluster network. A single-host file has one implied host and takes no --host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.schema.config import Deployment
from pdserve.schema.topology import IMPLIED_HOST, router_hosts


class HostChoiceError(ValueError):
    pass


@dataclass(frozen=True)
class Here:
    host: str
    why: str


def choose_host(dep: Deployment, asked: str | None, addresses: Sequence[str]) -> Here:
    if not dep.multi_host:
        if asked is not None:
            raise HostChoiceError(f"--host {asked}: deployment {dep.name} describes one host (no [hosts]); "
                                  "leave --host out")
        return Here(IMPLIED_HOST, "one host")
    names = list(dep.hosts)
    if asked is not None:
        if asked not in dep.hosts:
            raise HostChoiceError(
                f"--host {asked}: not a host of deployment {dep.name}; its hosts are {', '.join(names)}")
        return Here(asked, "--host")
    mine = [name for name, spec in dep.hosts.items() if spec.address in addresses]
    if len(mine) == 1:
        return Here(mine[0], f"its cluster address {dep.hosts[mine[0]].address} is this machine's")
    router = router_hosts(dep)[0]
    found = (f"this machine has the cluster addresses of {', '.join(mine)}" if mine
             else "no cluster address of the deployment is this machine's")
    return Here(router, f"{found}: the router's host (pass --host NAME to choose)")
