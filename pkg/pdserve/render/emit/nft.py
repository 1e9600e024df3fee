"""The nftables emitter: addresses, ports, sets, names, strings and comments of an `nft -f` file.

nft's scanner reads a comment from `#` to the end of the line, a string between double quotes with no
escape for a quote, and identifiers of letters, digits and `_` (more characters are allowed, but none is
needed). Addresses go in as plain canonical IP literals only: a zone ID (`fe80::1%eth0`) is "unexpected
junk" to nft, and a name would be resolved by nft at load time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pdserve.render.emit import EmitError
from pdserve.render.emit.text import shown
from pdserve.schema.addresses import parse_ip

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
# nft's NFT_NAME_MAXLEN is 256 bytes; the interface names pdserve writes are IFNAMSIZ-1 (15) at most.
_STRING = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def address(value: str) -> str:
    """A source/destination address: a canonical IPv4 or IPv6 literal, nothing else."""
    literal = parse_ip(value)
    if literal is None or literal.zone is not None or literal.mapped is not None or literal.canonical != value:
        raise EmitError(f"nft: {value!r} is not a plain canonical IP address")
    return literal.canonical


def family(value: str) -> str:
    """The nft family keyword (`ip` or `ip6`) that matches an address."""
    literal = parse_ip(address(value))
    assert literal is not None  # address() parsed it
    return "ip6" if literal.ip.version == 6 else "ip"


def port(value: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise EmitError(f"nft: {value!r} is not a TCP port")
    return str(value)


def port_range(first: int, last: int) -> str:
    if last < first:
        raise EmitError(f"nft: port range {first}-{last} runs backwards")
    return port(first) if first == last else f"{port(first)}-{port(last)}"


def anonymous_set(items: Iterable[str]) -> str:
    """`{ a, b }` of items already emitted (addresses, ports, ranges)."""
    listed = list(items)
    if not listed:
        raise EmitError("nft: an empty set matches nothing")
    return "{ " + ", ".join(listed) + " }"


def identifier(value: str) -> str:
    """A table or chain name."""
    if not _IDENTIFIER.fullmatch(value):
        raise EmitError(f"nft: {value!r} is not an identifier of letters, digits and _")
    return value


def string(value: str) -> str:
    """A quoted string such as an interface name (`iif "lo"`): nft has no escape for `"` or `\\`."""
    if not _STRING.fullmatch(value):
        raise EmitError(f"nft: {value!r} cannot be carried in an nft string")
    return f'"{value}"'


def comment(text: str, indent: str = "") -> str:
    """One comment line: control characters and line breaks in `text` are shown escaped, so no value can
    end the comment and start a rule."""
    return f"{indent}# {shown(text)}"
