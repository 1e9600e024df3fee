"""The in-process half of "carried exactly": for an accepted value, every output agrees with every other and
holds the value. `plan --json` is pdserve's statement of what it runs (argv, environment, unit texts,
ruleset); the files `render` wrote, the plain plan read by shlex, the deployment JSON read by a strict
parser and the Prometheus targets read as Prometheus splits them must all give that back. The consumers that
run outside Python (systemd, bash, nft, promtool) are batched by test_fields.py.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import re
from typing import Any
from urllib.parse import urlsplit

from tests.property.consumers import shell
from tests.property.outputs import Example, HostOutput
from tests.property.schema_fields import KeyOf
from tests.property.strict_json import NotStrictJson, strict_loads

CANONICAL_ADDRESS = ("address",)  # fields the schema stores in canonical form (hosts.<h>.address)


def same_value(got: Any, want: Any, canonical_address: bool = False) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, float) and type(want) is int:
        return got == want  # a float field takes an integer (1 is 1.0); JSON then writes it as a float
    if isinstance(want, float):
        return isinstance(got, float) and (got == want and math.copysign(1, got) == math.copysign(1, want))
    if isinstance(want, int):
        return type(got) is int and got == want
    if canonical_address and isinstance(got, str) and isinstance(want, str):
        try:
            return ipaddress.ip_address(got) == ipaddress.ip_address(want)
        except ValueError:
            return False
    return got == want


def _at(data: Any, location: tuple[Any, ...]) -> tuple[bool, Any]:
    node = data
    for part in location:
        if isinstance(part, KeyOf):
            return True, node
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, node


def deployment_json(example: Example, host: HostOutput) -> list[str]:
    """The deployment JSON `render` wrote (what the units' gates read at run time) holds the value."""
    name = f"pdserve-{example.name}.json"
    try:
        data = strict_loads(host.files[name], f"render's {name}")
    except NotStrictJson as exc:
        return [str(exc)]
    location = example.case.location
    found, got = _at(data, location)
    if isinstance(location[-1], KeyOf):
        return [] if found and isinstance(got, dict) and example.value in got else \
            [f"{name}: key {example.value!r} missing from {example.case.name}"]
    if not found:
        return [f"{name}: {example.case.name} is missing"]
    if not same_value(got, example.value, canonical_address=location[-1] in CANONICAL_ADDRESS):
        return [f"{name}: {example.case.name} = {got!r}, the file said {example.value!r}"]
    return []


def render_matches_plan(host: HostOutput) -> list[str]:
    failures = []
    for name, text in host.plan["units"].items():
        if host.files.get(name) != text:
            failures.append(f"render's {name} differs from plan --json's")
    if host.plan.get("firewall") is not None:
        written = [text for name, text in host.files.items() if name.endswith("-firewall.nft")]
        if written != [host.plan["firewall"]]:
            failures.append("render's firewall ruleset differs from plan --json's")
    return failures


def plain_plan(host: HostOutput) -> list[str]:
    """shlex reads each command back as env(1) with the role's environment running plan --json's argv, and the
    here-documents hold the unit texts and the ruleset byte for byte."""
    failures = []
    found = shell.blocks(host.plan_text)
    roles = list(host.plan["roles"].values())
    if len(found.commands) != len(roles):
        return [f"plain plan: {len(found.commands)} commands for {len(roles)} processes"]
    for role, command in zip(roles, found.commands, strict=True):
        try:
            env, argv = shell.split_environment(shell.shlex_words(command))
        except ValueError as exc:
            failures.append(f"plain plan: shlex cannot read {role['unit']}'s command: {exc}")
            continue
        if argv != role["argv"]:
            failures.append(f"plain plan: shlex reads {role['unit']}'s command as {argv!r}, not {role['argv']!r}")
        if env != role["env"]:
            failures.append(f"plain plan: {role['unit']}'s command passes {env!r}, not {role['env']!r}")
    documents = dict(host.plan["units"])
    if host.plan.get("firewall"):
        documents[f"pdserve-{host.plan['deployment']}-firewall.nft"] = host.plan["firewall"]
    if found.heredocs != documents:
        failures.append(f"plain plan: here-documents {sorted(found.heredocs)} differ from plan --json's files")
    return failures


def split_host_port(target: str) -> tuple[str, str]:
    """Go's net.SplitHostPort, which Prometheus applies to a target: [host]:port for a host with a colon."""
    if target.startswith("["):
        end = target.find("]")
        if end < 0 or target[end + 1:end + 2] != ":":
            raise ValueError(f"{target!r}: missing ']' or port")
        return target[1:end], target[end + 2:]
    host, sep, port = target.rpartition(":")
    if not sep or ":" in host:
        raise ValueError(f"{target!r}: too many colons or no port")
    return host, port


def monitoring(example: Example, host: HostOutput) -> list[str]:
    """The monitoring files are strict JSON (Prometheus reads them as YAML), each scrape target is host:port
    by Prometheus' own split, its host one Prometheus can dial."""
    failures = []
    for name, text in host.files.items():
        if not name.startswith("monitoring/"):
            continue
        body = "\n".join(line for line in text.split("\n") if not line.startswith("#"))
        try:
            data = strict_loads(body, name)
        except NotStrictJson as exc:
            failures.append(str(exc))
            continue
        if name.endswith("prometheus-scrape.yml"):
            for job in data:
                for target in (t for group in job["static_configs"] for t in group["targets"]):
                    try:
                        address, port = split_host_port(target)
                        ipaddress.ip_address(address) if ":" in address or address[:1].isdigit() else None
                        if "%" in address or not port.isdigit():
                            raise ValueError(f"{target!r}: a scope ID or a non-numeric port")
                    except ValueError as exc:
                        failures.append(f"{name}: job {job['job_name']}: target is not host:port: {exc}")
    return failures


def _texts(host: HostOutput) -> list[str]:
    texts = []
    for role in host.plan["roles"].values():
        texts += [*role["argv"], *role["env"].values(), *role["credentials"].values(), role["url"], role["unit"]]
    return texts + list(host.plan["units"].values()) + [host.plan.get("firewall") or ""] + \
        [text for name, text in host.files.items() if name.startswith("monitoring/")]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _renders(example: Example) -> bool:
    """Whether the field's value goes into any output at all: a host's inventory (gpus, numa_nodes, ib_devices)
    is only checked against; a multi-host file renders no monitoring files and binds no NUMA node (numactl)."""
    location = example.case.location
    if location[0] == "hosts" and len(location) > 2 and location[2] in ("gpus", "numa_nodes", "ib_devices"):
        return False
    return not (example.case.base == "multi" and (location[0] == "monitoring" or location == ("tools", "numactl")))


def value_reaches_outputs(example: Example) -> list[str]:
    """A value that changes what runs shows in what runs: a string verbatim in an argv word, an environment
    value, a credential path, a unit's text (with systemd's %% for %) or a monitoring file; a number as a
    numeral there, written so that it reads back as the same number."""
    value, case = example.value, example.case
    if "enum" in case.schema or value is None or value == case.original() or isinstance(value, bool) or \
            not _renders(example):
        return []  # a choice of behaviour, the base document's own value, or a field no output holds
    texts = [text for host in example.hosts for text in _texts(host)]
    if isinstance(value, str):
        if case.location[-1] in CANONICAL_ADDRESS:
            value = str(ipaddress.ip_address(value))  # what the schema stores, and the renderers carry
        if isinstance(case.location[-1], KeyOf) or any(value in text or value.replace("%", "%%") in text
                                                       for text in texts):
            return []
        return [f"{case.name} = {value!r} is in no argv, environment, unit or monitoring file of plan --json"]
    numerals = {n for text in texts for n in _NUMBER.findall(text)}
    if any(_equal_numeral(n, value) for n in numerals):
        return []
    return [f"{case.name} = {value!r} shows as no numeral in any argv, unit or monitoring file"]


def _equal_numeral(text: str, value: int | float) -> bool:
    try:
        return float(text) == value if isinstance(value, float) or "." in text or "e" in text else int(text) == value
    except (ValueError, OverflowError):
        return False


def _unmapped(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address)
    # An IPv4-mapped IPv6 address is the IPv4 address it maps, to the kernel and so to every class below.
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip


def _not_a_cluster_address(address: str) -> str | None:
    try:
        ip = _unmapped(address)
    except ValueError:
        return "is not an IP address"
    if "%" in address:
        return "carries a zone ID (only meaningful on one host's link)"
    for kind, test in (("the wildcard", ip.is_unspecified), ("loopback", ip.is_loopback),
                       ("multicast", ip.is_multicast), ("link-local", ip.is_link_local),
                       ("broadcast", ip == ipaddress.IPv4Address("255.255.255.255"))):
        if test:
            return f"is {kind} ({ip})"
    return None


def cluster_addresses(example: Example, host: HostOutput) -> list[str]:
    """A multi-host file's servers listen on, and are reached at, their host's cluster address: a routable
    unicast address without a zone ID, IPv4-mapped forms judged by the address they map (ISSUE-37: addresses
    in disguise); no two hosts share one."""
    if host.host is None:
        return []
    failures = []
    for role in host.plan["roles"].values():
        argv = role["argv"]
        for flag, value in itertools.pairwise(argv):
            if flag == "--host" and role["role"] != "router":
                address = value
            elif flag == "--dist-init-addr":
                address = value.rsplit(":", 1)[0]
            elif flag in ("--prefill", "--decode") and role["role"] == "router":
                address = (urlsplit(value).hostname or "") if "%" not in value else value.split("//", 1)[-1]
            else:
                continue
            why = _not_a_cluster_address(address.strip("[]").rsplit("]", 1)[0])
            if why:
                failures.append(f"{role['unit']}: {flag} {value!r}: the address {why}")
    seen: dict[str, str] = {}
    for name, spec in (example.data.get("hosts") or {}).items():
        try:
            canonical = str(_unmapped(spec["address"]))
        except ValueError:
            continue
        if canonical in seen:
            failures.append(f"hosts {seen[canonical]} and {name} share the address {canonical}")
        seen[canonical] = name
    return failures


def in_process(example: Example) -> list[str]:
    failures = []
    for host in example.hosts:
        failures += deployment_json(example, host) + render_matches_plan(host) + plain_plan(host) + \
            monitoring(example, host) + cluster_addresses(example, host)
    return failures + value_reaches_outputs(example)
