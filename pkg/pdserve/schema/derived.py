"""Values derived from a deployment that every layer reads: unit names, addresses, the router's timing.

Pure functions of the schema, so the renderer, the verifier, the cutover and the cross-deployment
rules all name the same units and reach the same URLs.
"""

from __future__ import annotations

from pdserve.schema.addresses import Kind, parse_ip
from pdserve.schema.config import Deployment, Role

# Name of the systemd credential that carries the API key (LoadCredential=<name>:<file>): the units are
# rendered with it, and the gate, verify and cutover read the key under it, so it lives in the lowest layer.
API_KEY_CREDENTIAL = "api-key"
# What a PD server's unit passes for that credential when the key file is not on its host (SetCredential=,
# render.units.service_section): a value no key file holds, which its gates recognise (systemd refuses
# empty data there).
MISSING_KEY_STAND_IN = "pdserve-stand-in-no-key-file-on-this-host"

# The router starts once both workers answer, so it needs minutes at most, not a model load.
ROUTER_START_TIMEOUT_SEC = 300


def unit_name(dep: Deployment, role: Role) -> str:
    return f"sglang-{dep.name}" if role == "fallback" else f"sglang-{dep.name}-{role}"


def connect_address(host: str) -> str:
    """The address (or name) a client on this host uses to reach a listener bound to `host`: a wildcard's
    loopback of the same family, else `host` itself."""
    literal = parse_ip(host)
    if host == "" or (literal is not None and literal.kind is Kind.WILDCARD):
        # A mapped wildcard (refused by the schema) would listen on IPv4: its meaning decides the family.
        return "::1" if literal is not None and literal.meaning.version == 6 else "127.0.0.1"
    return host


def connect_host(host: str) -> str:
    """connect_address as the host part of a URL: an IPv6 address in brackets."""
    address = connect_address(host)
    return f"[{address}]" if ":" in address else address


def url_of(host: str, port: int) -> str:
    return f"http://{connect_host(host)}:{port}"


def disaggregation_mode(role: Role) -> str:
    """The mode SGLang reports in /model_info for a role's server."""
    return {"prefill": "prefill", "decode": "decode", "fallback": "null"}[role]


# The router's own drain time when the deployment leaves it unset (its built-in default is 180 s).
ROUTER_SHUTDOWN_GRACE_SEC = 30
# Left between the end of the router's drain and systemd's SIGKILL, for the process to exit.
ROUTER_EXIT_MARGIN_SEC = 5


def router_shutdown_grace(dep: Deployment) -> int:
    """Seconds the router drains after SIGTERM: the deployment's value, else 30 s or less, so that it
    always ends before TimeoutStopSec= (systemd would SIGKILL it mid-drain)."""
    chosen = dep.router.shutdown_grace_period_secs
    if chosen is not None:
        return chosen
    return max(1, min(ROUTER_SHUTDOWN_GRACE_SEC, dep.systemd.stop_timeout_sec - ROUTER_EXIT_MARGIN_SEC))


