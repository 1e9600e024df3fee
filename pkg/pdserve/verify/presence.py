"""Whether anything of the deployment is on this host: its units installed here, its ports answering here.

The report's verdict leads with it, because on a host where nothing of the deployment runs every check
fails or skips for that one reason, and 31 rows do not say so as plainly as one line does.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pdserve.probes import net
from pdserve.probes.systemctl import SystemctlError, service
from pdserve.verify.context import Context

# A wildcard listen address is reached at loopback.
LOOPBACK_OF = {"0.0.0.0": "127.0.0.1", "::": "::1"}
CONNECT_TIMEOUT_SEC = 1.0


@dataclass(frozen=True)
class Presence:
    installed: list[str]  # the deployment's units of this host that systemd has loaded
    answering: list[str]  # "prefill 127.0.0.1:30000": its ports of this host that accept a connection
    looked_at: list[str]  # every unit and port it tried, for the verdict to name
    systemd: str | None = None  # why systemd was not asked (None: it was)

    @property
    def anything(self) -> bool:
        return bool(self.installed or self.answering)


def _units(ctx: Context) -> list[str]:
    exp = ctx.exp
    units = [w.unit for w in ctx.local().workers.values()]
    units.append(exp.fallback_unit)  # "" where there is none (several hosts)
    if ctx.here == exp.router_on:
        units.append(exp.router_unit)
    return list(dict.fromkeys(u for u in units if u))


def _ports(ctx: Context) -> list[tuple[str, str, int]]:
    """(what, address, port) of the deployment's listeners on this host."""
    found = [(key, LOOPBACK_OF.get(w.host, w.host), w.port)
             for key, w in ctx.local().workers.items() if w.serves_http]
    if ctx.here == ctx.exp.router_on:
        url = urlsplit(ctx.exp.router_url)
        host = url.hostname or "127.0.0.1"
        found.append(("router", LOOPBACK_OF.get(host, host), url.port or 80))
    return found


def observe(ctx: Context) -> Presence:
    units, ports = _units(ctx), _ports(ctx)
    looked_at = [*units, *(f"{what} {address}:{port}" for what, address, port in ports)]
    timeout = min(ctx.options.probe_timeout, CONNECT_TIMEOUT_SEC)
    answering = [f"{what} {address}:{port}" for what, address, port in ports if net.tcp_accepts(address, port, timeout)]
    reason = ctx.systemd_reason()
    installed: list[str] = []
    if reason is None and units:
        assert ctx.systemctl is not None
        try:
            states = ctx.systemctl.show(units)
        except SystemctlError as exc:
            reason = str(exc)
        else:
            installed = [u for u in units if states.get(service(u)) is not None and states[service(u)].installed]
    return Presence(installed, answering, looked_at, reason)
