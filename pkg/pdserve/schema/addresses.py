"""The address model: every address field of a deployment is read here once, classified, and refused
where no renderer could carry it or no host could use it. Pure.

An IP literal is parsed with `ipaddress` into what it means: an IPv4-mapped IPv6 address
(`::ffff:a.b.c.d`) is classified by the IPv4 address it maps, so `::ffff:0.0.0.0` is a wildcard and
`::ffff:127.0.0.1` loopback wherever a rule asks. The classes are defined by fixed networks here rather
than by `ipaddress`'s `is_private`/`is_global`, whose lists change between Python versions.

Non-canonical input is refused, not normalised: the file must hold the form pdserve renders
(`ipaddress`'s compressed form, lower case; a lower-case host name). The deployment's values reach the
NixOS module as written, and the module compares and pastes them as strings; with one spelling per
address, `2001:db8::1` and `2001:DB8:0::1` cannot pass as two hosts there while pdserve sees one, and
what the user wrote is exactly what every rendered file says. The fix gives the canonical form.

What is refused, and where (the NixOS module mirrors these rules; see `cluster_address_problem`
and `listen_host_problem`):
- everywhere: a zone ID (`%eth0`: it cannot go into a URL, an nft rule, a Prometheus target or
  --dist-init-addr), an IPv4-mapped IPv6 address (write the IPv4 address), a non-canonical spelling,
  the broadcast address, a multicast address, a link-local address (fe80::/10 cannot be bound or
  reached without a zone ID; 169.254.0.0/16 is not routed), the deprecated site-local fec0::/10, and
  reserved space (IPv4 0.0.0.0/8 but 0.0.0.0, 240.0.0.0/4; IPv6 ::/8 but :: and ::1: IPv4-compatible,
  the NAT64 prefix 64:ff9b::/96, which is a translator's and not a host's, and unassigned);
- a cluster address (`hosts.<h>.address`) is, besides, an IP literal and neither loopback nor wildcard;
- a listen address (`Host`) may be a host name: lower-case RFC 1123 labels whose last label is not
  numeric (glibc reads `010.1` or `0x7f000001` as IPv4 addresses: an address in disguise).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class Kind(StrEnum):
    """What an address is, by the address it means (a mapped IPv6 address: the IPv4 address it maps)."""

    UNICAST = "a unicast"
    LOOPBACK = "a loopback"
    WILDCARD = "a wildcard"
    BROADCAST = "the broadcast"
    MULTICAST = "a multicast"
    LINK_LOCAL = "a link-local"
    SITE_LOCAL = "a site-local"
    RESERVED = "a reserved"


_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# Checked in order: the first network that holds the address names its kind.
_KINDS: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, Kind], ...] = (
    (_V4("0.0.0.0/32"), Kind.WILDCARD),
    (_V4("0.0.0.0/8"), Kind.RESERVED),  # "this network": a source address only (RFC 1122)
    (_V4("127.0.0.0/8"), Kind.LOOPBACK),
    (_V4("169.254.0.0/16"), Kind.LINK_LOCAL),
    (_V4("224.0.0.0/4"), Kind.MULTICAST),
    (_V4("255.255.255.255/32"), Kind.BROADCAST),
    (_V4("240.0.0.0/4"), Kind.RESERVED),
    (_V6("::/128"), Kind.WILDCARD),
    (_V6("::1/128"), Kind.LOOPBACK),
    (_V6("::/8"), Kind.RESERVED),  # IPv4-compatible (deprecated, RFC 4291) and unassigned; mapped: see meaning
    (_V6("fe80::/10"), Kind.LINK_LOCAL),
    (_V6("fec0::/10"), Kind.SITE_LOCAL),
    (_V6("ff00::/8"), Kind.MULTICAST),
)


@dataclass(frozen=True)
class IpLiteral:
    """An IP address as written: the address, and its zone ID (the part after %) if any."""

    written: str
    ip: IP
    zone: str | None

    @property
    def mapped(self) -> ipaddress.IPv4Address | None:
        return self.ip.ipv4_mapped if isinstance(self.ip, ipaddress.IPv6Address) else None

    @property
    def meaning(self) -> IP:
        """The address it stands for: the IPv4 address a mapped IPv6 address maps, else itself."""
        return self.mapped or self.ip

    @property
    def kind(self) -> Kind:
        meaning = self.meaning
        return next((kind for net, kind in _KINDS if net.version == meaning.version and meaning in net),
                    Kind.UNICAST)

    @property
    def canonical(self) -> str:
        """ipaddress's compressed, lower-case form, without a zone ID."""
        return str(self.ip)


def parse_ip(value: str) -> IpLiteral | None:
    """`value` as an IP literal (a zone ID split off), or None when it is none."""
    address, _, zone = value.partition("%")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return IpLiteral(value, ip, zone if "%" in value else None)


def kind_of(host: str) -> Kind | None:
    """The kind of an IP literal (mapped and zoned ones included), None for a name or junk."""
    literal = parse_ip(host)
    return literal.kind if literal else None


def is_loopback(host: str) -> bool:
    """Whether a listener bound to `host` is reachable from this host only: `localhost` or a loopback
    address, written plainly or IPv4-mapped (`::ffff:127.0.0.1`)."""
    return host == "localhost" or kind_of(host) is Kind.LOOPBACK


def is_wildcard(host: str) -> bool:
    """Whether a listener bound to `host` listens on every address: 0.0.0.0, :: or ::ffff:0.0.0.0."""
    return kind_of(host) is Kind.WILDCARD


# A refusal: (what is wrong, the fix), worded to follow "<field> = <value>: ".
Refusal = tuple[str, str]

# Kinds no address field may hold, and why.
_UNUSABLE = {
    Kind.BROADCAST: "no host has it",
    Kind.MULTICAST: "it names a group, not a host, and TCP neither listens nor connects there",
    Kind.LINK_LOCAL: "it is not routed beyond its link, and an IPv6 one cannot be bound or reached without a "
                     "zone ID, which no rendered file can carry",
    Kind.SITE_LOCAL: "fec0::/10 is deprecated (RFC 3879)",
    Kind.RESERVED: "it is reserved space, not an address a host is given",
}
# A cluster address, besides: the servers placed on the host listen on it, and the other hosts connect to it.
_NOT_CLUSTER = {
    **_UNUSABLE,
    Kind.LOOPBACK: "the servers placed on this host listen on it, and the other hosts must reach them there",
    Kind.WILDCARD: "the servers placed on this host listen on it, and the other hosts must reach them there",
}


def _ip_problem(literal: IpLiteral, refused: dict[Kind, str], example: str) -> Refusal | None:
    """What an IP literal in an address field may not be: zoned, mapped, of a `refused` kind, non-canonical."""
    if literal.zone is not None:
        return (f"has a zone ID (%{literal.zone}), which pdserve cannot carry into the files it renders",
                f"write the address without %{literal.zone} (a zone ID cannot go into URLs, nftables rules, "
                "Prometheus targets or --dist-init-addr); use a routable address of the host, not a link-local "
                f"one, e.g. {example}")
    if literal.mapped is not None:
        # Judged as the IPv4 address it maps, which is what a socket bound or connected to it uses.
        plain = str(literal.mapped)
        inner = _ip_problem(IpLiteral(plain, literal.mapped, None), refused, example)
        if inner:
            return f"is an IPv4-mapped IPv6 address, {plain} in disguise, and {plain} {inner[0]}", inner[1]
        return f"is an IPv4-mapped IPv6 address, {plain} in disguise", f"write the IPv4 address itself: {plain}"
    if literal.kind in refused:
        return (f"is {literal.kind.value} address: {refused[literal.kind]}",
                f"write this host's own address on the {'cluster ' if refused is _NOT_CLUSTER else ''}network, "
                f"e.g. {example}")
    if literal.written != literal.canonical:
        return (f"is not written in canonical form ({literal.canonical})",
                f"write {literal.canonical} (lower case, no leading zeros, the longest run of zero groups as ::)")
    return None


def cluster_address_problem(value: str) -> Refusal | None:
    """Why `value` cannot be a cluster address (`hosts.<h>.address`), or None. A cluster address is a
    routable unicast IP literal in canonical form: the other hosts reach this one there, the firewall
    rules match it, --dist-init-addr and the router's worker URLs carry it (a name would resolve
    differently per host, or not at all at boot)."""
    example = "10.0.0.1"
    literal = parse_ip(value)
    if literal is None:
        return ("is not an IP address",
                f"write the IP address the other hosts reach this host at, e.g. {example} (the firewall rules and "
                "--dist-init-addr need an address, not a name)")
    return _ip_problem(literal, _NOT_CLUSTER, example)


_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# What inet_aton (and so getaddrinfo) reads as a number: a host name ending so is an IPv4 address in disguise.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
MAX_NAME = 253


def listen_host_problem(value: str) -> Refusal | None:
    """Why `value` cannot be a listen address (router.host, router.prometheus_host, a server's host), or
    None. An IP literal follows the cluster address's rules but may be loopback or a wildcard (the rules
    decide per field); a host name is lower-case RFC 1123 labels, the last one not numeric."""
    example = "127.0.0.1"
    literal = parse_ip(value)
    if literal is not None:
        return _ip_problem(literal, _UNUSABLE, example)
    labels = value.lower().split(".")
    if len(value) <= MAX_NAME and all(_LABEL.fullmatch(label) for label in labels):
        if _NUMERIC_LABEL.fullmatch(labels[-1]):
            return ("reads as a number where a host name ends, so the resolver takes it for an IPv4 address "
                    "(inet_aton) in a non-canonical spelling", "write the IPv4 address in dotted decimal, e.g. "
                    f"{example}, or a host name whose last label has a letter")
        if value != value.lower():
            return (f"is not written in canonical form ({value.lower()})", f"write {value.lower()} (host names in "
                    "lower case)")
        return None
    return ("is neither an IP address nor a host name",
            f"use an address such as {example}, 0.0.0.0 or ::1, or a host name of letters, digits, - and .")
