"""Cluster addresses the module's firewall (nixos-modules/firewall-rules.nix, addresses.nix) must refuse or carry,
the rule they are judged by, written with Python's ipaddress (a cluster address is a canonical IPv4 dotted
quad or canonical lower-case IPv6, str(ip_address(value)) == value, without a zone ID, and routable unicast:
not unspecified, loopback, 255.255.255.255, multicast, link-local or IPv4-mapped), and what the firewall must
do for a deployment, from pdserve's listeners: both tiers (test_firewall_nix.py without nixpkgs,
test_eval_hosts.py with it) hold the module to these."""

from __future__ import annotations

import ipaddress
import random
from typing import Any

from pdserve.schema.config import Deployment
from pdserve.schema.listeners import listeners_on

# Values that would be shell or nftables code, or a ruleset nft refuses, if pasted into a rule.
HOSTILE = {
    "semicolon": "10.0.0.1;touch pwned",
    "command substitution in a zone ID": "fe80::1%$(touch pwned);",
    "command substitution": "$(touch pwned)",
    "backticks": "`touch pwned`",
    "single quote": "10.0.0.1' -j ACCEPT; touch pwned; '",
    "double quote": '10.0.0.1" -j ACCEPT "',
    "newline": "10.0.0.1\ntouch pwned",
    "nft set break-out": "10.0.0.1 } accept; ip saddr { 0.0.0.0/0",
    "zone ID": "fe80::1%eth0",
    "zone ID on a routable address": "fd00::1%eth0",
    "IPv4-mapped wildcard": "::ffff:0.0.0.0",
    "IPv4-mapped loopback": "::ffff:127.0.0.1",
    "IPv4-mapped, hex": "::ffff:a14:1",
    "link-local": "fe80::1",
    "IPv4 link-local": "169.254.10.1",
    "broadcast": "255.255.255.255",
    "wildcard": "0.0.0.0",
    "IPv6 wildcard": "::",
    "loopback": "127.0.0.1",
    "IPv6 loopback": "::1",
    "multicast": "239.1.1.1",
    "reserved": "240.0.0.1",
    "this network": "0.1.2.3",
    "IPv4-compatible": "::a14:4",
    "site-local": "fec0::1",
    "IPv6 multicast": "ff02::1",
    "upper case": "FD00::1",
    "uncompressed": "fd00:0:0:0:0:0:0:4",
    "leading zeros": "010.20.0.4",
    "a network, not an address": "10.20.0.0/24",
    "a host name": "gpu-d",
    "empty": "",
    "trailing space": "10.20.0.4 ",
}
VALID_V4 = "10.20.0.4"
VALID_V6 = "fd00::4"
VALID = [VALID_V4, VALID_V6, "192.168.1.20", "2001:db8::", "2001:db8:0:1:1:1:1:1", "2001:db8::1:0:0:1"]


# The classes a cluster address may not be in, each with the word the Nix message names it by; disjoint.
REFUSED_NETWORKS = [(ipaddress.ip_network(net), word) for net, word in [
    ("0.0.0.0/32", "wildcard"), ("0.0.0.0/8", "reserved"), ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"), ("224.0.0.0/4", "multicast"), ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "wildcard"), ("::1/128", "loopback"), ("::/8", "reserved"), ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"), ("ff00::/8", "multicast"),
]]


def verdict(value: object) -> str | None:
    """The class that refuses `value` as a cluster address (a word of the Nix message), None if it passes."""
    if not isinstance(value, str):
        return "not a string"
    if "%" in value:
        return "zone ID"
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return "not an IP address"
    # Judged by what they map to by some Python versions, as themselves by others: refused before either.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return "IPv4-mapped"
    for network, word in REFUSED_NETWORKS:
        if network.version == address.version and address in network:
            return word
    return None if str(address) == value else "canonical"


def spellings(seed: int, count: int) -> list[str]:
    """Addresses written every way Python's ipaddress reads them, and near misses it does not: seeded, so a
    failure names a case that comes back."""
    rng = random.Random(seed)
    out: list[str] = []
    group_choices = [0, 0, 0, 1, 0xffff, 0xfe80, 0xfebf, 0xfec0, 0xfeff, 0xff02, 0xfd00, 0x2001, 0xdb8, 0xff, 0x100]
    while len(out) < count:
        groups = [rng.choice(group_choices) if rng.random() < 0.7 else rng.randrange(1 << 16) for _ in range(8)]
        special = rng.random()
        if special < 0.2:
            groups[:6] = [0, 0, 0, 0, 0, 0xffff]
        elif special < 0.25:
            groups = [0] * 7 + [rng.choice([0, 1])]  # the wildcard and loopback, spelled every way too
        v6 = ipaddress.IPv6Address(sum(g << (16 * (7 - i)) for i, g in enumerate(groups)))
        octets = [rng.choice([0, 1, 10, 127, 169, 223, 224, 239, 240, 254, 255, rng.randrange(256)]) for _ in range(4)]
        v4 = rng.choice([".".join(map(str, octets))] * 8 + ["0.0.0.0", "255.255.255.255"])
        tail = ipaddress.IPv4Address(int(v6) & 0xffffffff)
        forms = [
            str(v6), v6.exploded, str(v6).upper(), v4,
            ":".join(f"{g:x}" for g in groups),
            ":".join(f"{g:0{rng.randrange(1, 5)}x}" for g in groups),
            ":".join(f"{g:x}" for g in groups[:6]) + f":{tail}",
            # A zero run compressed that is not the longest (or a single group): not canonical.
            _compress_somewhere(groups, rng),
            ".".join(f"{o:03d}" for o in octets),
            ":".join(f"{g:x}" for g in groups[:6]) + f":{v4}",
        ]
        value = rng.choice(forms)
        if rng.random() < 0.25:  # a near miss: one character added, removed or changed
            position = rng.randrange(len(value) + 1)
            value = value[:position] + rng.choice("0:.fF%g ") + value[position + rng.randrange(2):]
        out.append(value)
    return out


def _compress_somewhere(groups: list[int], rng: random.Random) -> str:
    zeros = [i for i, g in enumerate(groups) if g == 0]
    if not zeros:
        return ":".join(f"{g:x}" for g in groups)
    start = rng.choice(zeros)
    end = start
    while end + 1 < 8 and groups[end + 1] == 0 and rng.random() < 0.8:
        end += 1
    return ":".join(f"{g:x}" for g in groups[:start]) + "::" + ":".join(f"{g:x}" for g in groups[end + 1:])


def expected_firewall(dep: Deployment, host: str) -> dict[str, Any]:
    """What the module's firewall must do on `host` for `dep`: each worker listener opened to its peers'
    addresses, every worker port closed to the deployment's other hosts, those hosts trusted otherwise."""
    workers = [item for item in listeners_on(dep, host) if item.worker_port]
    return {
        "deployment": dep.name,
        "opened": [{"purpose": item.purpose, "first": item.first, "last": item.last,
                    "sources": [dep.hosts[peer].address for peer in item.reached_from]}
                   for item in workers if item.reached_from],
        "closed": [{"first": item.first, "last": item.last} for item in workers],
        "peers": [spec.address for name, spec in dep.hosts.items() if name != host],
    }


def expected_argv(records: list[dict[str, Any]]) -> list[list[str]]:
    """The iptables calls the module's extraCommands must make, in order, for the firewall `records`: all
    opened ports first, then the closed ones, then the peers (one deployment's peers must not pass another's
    worker ports); each address exactly one argument."""
    def tool(address: str) -> str:
        return "ip6tables" if ipaddress.ip_address(address).version == 6 else "iptables"

    def ports(rule: dict[str, Any]) -> str:
        return str(rule["first"]) if rule["first"] == rule["last"] else f"{rule['first']}:{rule['last']}"

    calls = [[tool(s), "-A", "nixos-fw", "-p", "tcp", "-s", s, "--dport", ports(r), "-j", "nixos-fw-accept"]
             for f in records for r in f["opened"] for s in r["sources"]]
    calls += [[tool(p), "-A", "nixos-fw", "-p", "tcp", "-s", p, "-m", "multiport", "--dports",
               ",".join(ports(r) for r in f["closed"]), "-j", "DROP"]
              for f in records if f["closed"] for p in f["peers"]]
    calls += [[tool(p), "-A", "nixos-fw", "-s", p, "-j", "nixos-fw-accept"] for f in records for p in f["peers"]]
    return calls
