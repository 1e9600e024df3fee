"""The nftables ruleset of one host of a multi-host deployment. Pure: a deployment and a host in, the text of
an `nft -f` file out.

It opens each worker port of the host only to the hosts that must reach it (pdserve.schema.listeners says
which) and drops new connections to those ports from anywhere else; loopback (which carries the host's
traffic to its own addresses too) always passes. It governs the deployment's own ports and nothing else:
one table of its own (`inet pdserve_<name>`), replaced whole on every load, with an accept policy, so the
host's other rules stay the host's. The router's public port and its metrics port are left to the host's
firewall (NixOS: services.pdserve's openFirewall).

Not covered, on purpose: SGLang's KV side channel (each rank's ZMQ socket, bound to a random port from
pyzmq's bind_to_random_port range 49152-65535, sglang 0.5.23 disaggregation/common/conn.py), NCCL's and
UCX's own sockets between nodes, and RDMA traffic (which bypasses netfilter). Their ports are ephemeral and
chosen at run time, so no rule here could name them without opening or closing far more than the
deployment's; the ruleset leaves them to the host's policy, and says so in its text.

Every value reaches the file through pdserve.render.emit.nft: addresses as canonical IP literals (the schema
refuses zone IDs, mapped and link-local addresses: pdserve.schema.addresses), ports as numbers, names as
identifiers, and comments with any line break shown escaped, so no value can end a rule or a comment early.
"""

from __future__ import annotations

from pdserve.render.emit import nft
from pdserve.schema.config import Deployment
from pdserve.schema.listeners import Listener, listeners_on
from pdserve.schema.topology import host_address

FIREWALL_SUFFIX = "-firewall.nft"


def table_name(dep: Deployment) -> str:
    # Deployment names are [a-z0-9-] (schema.fields.UNIT_NAME): '-' -> '_' keeps them distinct and nft-safe.
    return nft.identifier(f"pdserve_{dep.name.replace('-', '_')}")


def firewall_filename(dep: Deployment) -> str:
    return f"pdserve-{dep.name}{FIREWALL_SUFFIX}"


def _sources(dep: Deployment, hosts: tuple[str, ...]) -> dict[str, list[str]]:
    """family match ("ip saddr" / "ip6 saddr") -> addresses of `hosts`."""
    found: dict[str, list[str]] = {}
    for host in hosts:
        address = host_address(dep, host)
        if address is None:
            continue
        found.setdefault(f"{nft.family(address)} saddr", []).append(nft.address(address))
    return found


def _allow_lines(dep: Deployment, listener: Listener) -> list[str]:
    who = ", ".join(listener.reached_from) if listener.reached_from else "no other host"
    ports = nft.port_range(listener.first, listener.last)
    lines = [nft.comment(f"{listener.purpose} ({listener.field}, port {ports}): from {who}", "\t\t")]
    for match, addresses in _sources(dep, listener.reached_from).items():
        lines.append(f"\t\ttcp dport {ports} {match} {nft.anonymous_set(addresses)} accept")
    return lines


def render_firewall(dep: Deployment, host: str) -> str:
    """The ruleset text for `host` (one of dep.hosts)."""
    table = table_name(dep)
    guarded = [item for item in listeners_on(dep, host) if item.worker_port]
    lines = [
        "#!/usr/sbin/nft -f",
        nft.comment(f"Rendered by pdserve from deployment {dep.name!r} for host {host} ({host_address(dep, host)})."),
        "# Do not edit: change the deployment and render again. Load with `nft -f FILE` (it replaces the table).",
        "# Each worker port of this host is open only to the hosts that use it; new connections to it from",
        "# anywhere else are dropped. Other ports are not this table's: SGLang's KV side channel (random ports",
        "# 49152-65535 on every rank), NCCL's and UCX's sockets and RDMA are left to the host's own policy.",
        "",
        # Declaring the table first makes the delete succeed on a host that never had it: one atomic load.
        f"table inet {table}",
        f"delete table inet {table}",
        "",
        f"table inet {table} {{",
        "\tchain input {",
        # Before the distribution's usual filter chains (priority 0), so their accepts cannot pre-empt the drop.
        "\t\ttype filter hook input priority filter - 10; policy accept;",
        f"\t\tiif {nft.string('lo')} accept",
        "\t\tct state established,related accept",
    ]
    for listener in guarded:
        lines += _allow_lines(dep, listener)
    if guarded:
        ports = nft.anonymous_set(nft.port_range(item.first, item.last) for item in guarded)
        lines += ["\t\t# Everything else that reaches these ports: dropped.",
                  f"\t\ttcp dport {ports} counter drop"]
    else:
        lines.append("\t\t# This host runs no worker of the deployment: nothing to guard.")
    lines += ["\t}", "}"]
    return "\n".join(lines) + "\n"
