"""Hostile and odd values for every kind of field: a dictionary of known-hostile fragments (shell, systemd,
nftables, YAML/PromQL, argv, Unicode), the addresses that hide a class (zone IDs, IPv4-mapped, link-local,
broadcast, multicast, wildcard), the numbers that break formats (NaN, infinities, -0.0, huge integers), mixed
with purely random text.

`curated(case)` are the values every field of its kind is tried with (explicit hypothesis examples, run in
CI every time); `values(case)` is the strategy hypothesis draws more from.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from tests.property.schema_fields import BASES, FieldCase

# Each of these means something to one of the consumers: a shell (quotes, ; $( ) ` \ newline), systemd
# (% specifiers, $ expansion, \ continuation, leading - @ + ! : prefixes of Exec lines), nftables and
# YAML/PromQL ({ } # , quotes), argv parsers (a leading -), terminals and text tools (ESC, RTL override,
# combining marks, BOM, U+2028), JSON (lone surrogates, which only a JSON file can carry).
FRAGMENTS = [
    "'", '"', "`", ";", "$(touch /tmp/pdserve-pwned)", "`id`", "$HOME", "${HOME}", "$$", "%", "%n", "%%", "\\",
    "\\n", "\n", "\r", "\t", "\x00", "\x01", "\x1b[2J", "\x7f", "\x85", "\u2028", "\u202e", "e\u0301", "\ufeff",
    "\u200b", "\ud800", " ", "  ", "-", "--", "--help", "-rf", "{", "}", "#", "{{", "}}", "&&", "|", ">", "<", "*",
    "?", "[", "]", "~", "!", "..", "/", "=", ",", ":", "@", "+", "ü€😀", "\U0001F600", "0x41", "-1",
]

STRINGS = [
    "", " ", "-", "--help", "-oProxyCommand=x", "a b", " lead", "trail ", "a;b", "a'b", 'a"b', "a\\b", "ends\\",
    "$(touch /tmp/pdserve-pwned)", "`id`", "${HOME}", "100%", "%n", "{x}", "#x", "a\nb", "a\rb", "a\tb", "a\x00b",
    "\x1b[31m", "\x7f", "\u202eevil", "e\u0301", "\ud800", "ü€😀", "x" * 4096, "y" * 131073,
]

# Listen and cluster addresses: each hides a class ISSUE-37 names (zone IDs carrying code, link-local with a
# zone, IPv4-mapped wildcard/loopback/peer, broadcast, multicast), or is an odd spelling of a plain address.
ADDRESSES = [
    "fe80::1%eth0", "fe80::1%;touch /tmp/pdserve-pwned", "fe80::1%$(id)", "fe80::1%`id`", "fe80::1% x",
    "fe80::1%{", "fe80::1%}#", "::1%lo", "2001:db8::1%0", "::ffff:0.0.0.0", "::ffff:127.0.0.1", "::ffff:10.20.0.3",
    "::ffff:10.20.0.2", "::ffff:a14:2", "255.255.255.255", "224.0.0.1", "ff02::1", "169.254.0.1", "fe80::1",
    "0.0.0.0", "::", "127.0.0.2", "::1", "[::1]", " 10.20.0.9", "10.20.0.9 ", "0:0:0:0:0:0:0:1", "FE80::1",
    "2001:db8::1", "10.0.0.256", "localhost", "-x", "a..b",
]

# Path fields: where a unit cannot see (PrivateTmp=, ProtectHome=), and shell/systemd syntax inside an
# absolute path.
PATHS = [
    "/tmp/pdserve/x", "/var/tmp/x", "/dev/shm/x", "/dev/pdserve/x", "/home/user/x", "/root/x", "/run/user/1000/x",
    "/opt/a b/x",
    "/opt/x;y", "/opt/$(id)/x", "/opt/%n/x", "/opt/-x", "/opt/x'y", '/opt/x"y', "/opt/x\\y", "/opt/ü€😀/x",
    "/opt/x/", "/opt/./x", "/opt/../x", "//opt/x", "/opt/x ", "/", "/opt/{x}#",
]
_PATH_FIELDS = {"path", "chat_template", "api_key_file", "sglang_python", "sglang_venv", "numactl", "pdserve"}

# Names that are valid but odd (the shortest, the longest, digits first): the tier must also see such
# values rendered, not only refused.
NAMES = ["a", "0", "a-b", "9-9", "x" * 41, "x" * 42]
USERS = ["_x", "a-b_c", "A", "x" * 31, "x" * 32]
UNITS = ["default.target", "a@b.target", "x:y.target", "a.service", "x" * 250 + ".target"]
DEVICES = ["mlx5_0.x:1-2", "a" * 64, "a" * 65]

# Numbers: what JSON and TOML can carry and a format may not (NaN, infinities, -0.0, 10**400, 2**63), the
# wrong type (bool, float for an int, a numeric string, null), and the edges of each field's range.
NUMBERS = [math.nan, math.inf, -math.inf, -0.0, 0, 0.0, -1, 1, True, False, 2**31 - 1, 2**31, 2**63, -(2**63), 2**64,
           10**400, 1.5, 5e-324, 1e308, 0.1 + 0.2, "8000", None]


def _bounds(case: FieldCase) -> list[Any]:
    schema = case.schema
    found: list[Any] = []
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            edge = schema[key]
            found += [edge, edge - 1, edge + 1] if case.kind == "integer" else [edge, math.nextafter(edge, -math.inf),
                                                                              math.nextafter(edge, math.inf)]
    return found


def _is_address(case: FieldCase) -> bool:
    return case.location[-1] in ("host", "prometheus_host", "address")


def _own_address(case: FieldCase) -> str | None:
    if case.base != "multi" or case.location[-1] != "host" or not isinstance(case.location[1], int):
        return None
    server = BASES["multi"][case.location[0]][case.location[1]]
    return BASES["multi"]["hosts"][server["hosts"][0]]["address"]


def curated(case: FieldCase) -> list[Any]:
    if case.kind in ("integer", "number"):
        return [*NUMBERS, *_bounds(case)]
    base = case.original()
    values = list(ADDRESSES) if _is_address(case) else list(STRINGS)
    last = case.location[-1]
    if last in _PATH_FIELDS:
        values += PATHS
    if last == "name" or (case.renames_key and case.location[0] == "hosts"):
        values += NAMES
    if last in ("user", "group") or case.location[-2:-1] == ("supplementary_groups",):
        values += USERS
    if last == "wanted_by":
        values += UNITS
    if "ib_devices" in case.location:
        values += DEVICES
    values += case.schema.get("enum", [])
    own = _own_address(case)
    if own:
        # A placed server listens on its host's address: that address in disguise (IPv4-mapped, other spellings).
        values += [own, f"::ffff:{own}", f"::ffff:{own}%eth0", f"{own}%eth0", f"0{own}"]
    if isinstance(base, str) and not _is_address(case):
        # The field's own good value with hostile text around it: what slips past a prefix or suffix check.
        values += [f"{base};x", f"{base} $(id)", f"-{base}", f"{base}%n", f"{base}\\", f"{base}{{}}#"]
    if "enum" in case.schema:
        values += [f" {case.schema['enum'][0]}", case.schema["enum"][0].upper()]
    if not case.renames_key:  # a JSON key is always text: a number there is the text "1"
        values += [1, True]  # a number where text belongs
    return values


_ANY_CHAR = st.characters(codec=None, exclude_categories=())  # surrogates included: JSON carries them


def _text() -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(FRAGMENTS), st.text(_ANY_CHAR, max_size=6))
    return st.lists(pieces, min_size=1, max_size=5).map("".join)


def values(case: FieldCase) -> st.SearchStrategy[Any]:
    if case.kind == "integer":
        return st.one_of(st.integers(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.booleans())
    if case.kind == "number":
        return st.one_of(st.floats(), st.integers(min_value=-(2**70), max_value=2**70))
    base = case.original()
    if _is_address(case):
        zone = st.text(_ANY_CHAR, min_size=1, max_size=8) | st.sampled_from(FRAGMENTS)
        v6 = st.ip_addresses(v=6).map(str)
        return st.one_of(st.ip_addresses().map(str), st.tuples(v6, zone).map("%".join),
                         st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"), _text())
    around = st.tuples(_text(), _text()).map(lambda p: f"{p[0]}{base}{p[1]}") if isinstance(base, str) else _text()
    return st.one_of(_text(), around)
