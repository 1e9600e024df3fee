"""This host's non-loopback addresses, and whether a TCP port answers on one of them."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from pdserve.probes.observations import PortProbe

_SIOCGIFADDR = 0x8915
CONNECT_TIMEOUT_SEC = 0.25  # the cutover's refusal prober: a loopback connect answers in well under this


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_global() -> list[str]:
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        raw = line.split()[0]
        address = ipaddress.IPv6Address(bytes.fromhex(raw))
        if not (address.is_loopback or address.is_link_local):
            found.append(str(address))
    return found


def host_addresses() -> list[str]:
    """Every non-loopback IPv4 address of an interface, and every global IPv6 address."""
    found = []
    for _, name in socket.if_nameindex():
        address = _ipv4_of(name)
        if address and not ipaddress.IPv4Address(address).is_loopback and address not in found:
            found.append(address)
    return found + [a for a in _ipv6_global() if a not in found]


def probe(address: str, port: int, what: str, timeout: float) -> PortProbe:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
        except OSError as exc:
            return PortProbe(address, port, what, False, exc.strerror or type(exc).__name__)
    return PortProbe(address, port, what, True)


def tcp_accepts(host: str, port: int, timeout: float = CONNECT_TIMEOUT_SEC) -> bool:
    """Whether a TCP connection to host:port is accepted within `timeout` (a bracketed IPv6 host is fine)."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout):
            return True
    except OSError:
        return False
