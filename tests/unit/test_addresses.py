"""The address model (pdserve.schema.addresses): one refusal per hostile or odd address class, for the cluster
address and for the listen addresses, each naming the field, the value, what is wrong and the fix; the
classes by the address meant (IPv4-mapped ones included); a bad address that hides no other problem."""

from __future__ import annotations

import re
import tomllib

import pytest

from pdserve.schema.addresses import Kind, cluster_address_problem, is_loopback, is_wildcard, kind_of
from pdserve.schema.derived import connect_host
from pdserve.schema.loading import default_profile_text
from pdserve.schema.problems import Problem
from pdserve.verify.expect import is_loopback as verify_is_loopback
from tests.unit.test_multihost_schema import problems_of, two_host


def one_host() -> dict:
    return tomllib.loads(default_profile_text())


def refusal(data: dict, field: str) -> Problem:
    found = [p for p in problems_of(data) if p.field == field]
    assert len(found) == 1, (field, [p.line() for p in problems_of(data)])
    assert found[0].severity.value == "error"
    return found[0]


# (value, words of the message, words of the fix) for hosts.<h>.address
CLUSTER_REFUSALS = [
    # zone IDs: no rendered file can carry them, and the second is shell code
    ("fe80::1%eth0", "has a zone ID (%eth0)", "without %eth0"),
    ("fe80::1%$(touch /tmp/x);", "has a zone ID (%$(touch /tmp/x);)", "without %$(touch /tmp/x);"),
    ("fe80::1%$(reboot);", "has a zone ID", "without %$(reboot);"),
    ("2001:db8::1%1", "has a zone ID (%1)", "use a routable address"),
    ("10.10.0.1%eth0", "has a zone ID (%eth0)", "without %eth0"),
    ("fe80::1%", "has a zone ID (%)", "without %"),
    # IPv4-mapped: judged as the IPv4 address they map
    ("::ffff:0.0.0.0", "0.0.0.0 in disguise, and 0.0.0.0 is a wildcard address", "e.g. 10.0.0.1"),
    ("::ffff:127.0.0.1", "127.0.0.1 in disguise, and 127.0.0.1 is a loopback address", "e.g. 10.0.0.1"),
    ("::ffff:10.10.0.9", "IPv4-mapped IPv6 address, 10.10.0.9 in disguise", "write the IPv4 address itself: 10.10.0.9"),
    ("::ffff:a0a:9", "10.10.0.9 in disguise", "10.10.0.9"),
    ("0:0:0:0:0:ffff:a0a:9", "10.10.0.9 in disguise", "10.10.0.9"),
    # classes that no host has, or that no other host reaches
    ("255.255.255.255", "is the broadcast address", "e.g. 10.0.0.1"),
    ("224.0.0.1", "is a multicast address", "e.g. 10.0.0.1"),
    ("ff02::1", "is a multicast address", "e.g. 10.0.0.1"),
    ("fe80::1", "is a link-local address", "e.g. 10.0.0.1"),
    ("169.254.10.1", "is a link-local address", "e.g. 10.0.0.1"),
    ("fec0::1", "site-local", "e.g. 10.0.0.1"),
    ("::a0a:1", "is a reserved address", "e.g. 10.0.0.1"),  # IPv4-compatible (deprecated)
    ("64:ff9b::a0a:1", "is a reserved address", "e.g. 10.0.0.1"),  # a NAT64 translator's prefix, not a host's
    ("240.0.0.1", "is a reserved address", "e.g. 10.0.0.1"),
    ("0.1.2.3", "is a reserved address", "e.g. 10.0.0.1"),
    ("127.0.0.1", "is a loopback address", "cluster network"),
    ("::1", "is a loopback address", "cluster network"),
    ("0.0.0.0", "is a wildcard address", "cluster network"),
    ("::", "is a wildcard address", "cluster network"),
    # non-canonical spellings: refused with the canonical form, so one address has one string everywhere
    ("2001:DB8::1", "is not written in canonical form (2001:db8::1)", "write 2001:db8::1"),
    ("2001:db8:0:0:0:0:0:1", "canonical form (2001:db8::1)", "write 2001:db8::1"),
    ("2001:0db8::0001", "canonical form (2001:db8::1)", "write 2001:db8::1"),
    ("FD00::2", "canonical form (fd00::2)", "write fd00::2"),
    # not an address at all
    ("gpu-b.cluster", "is not an IP address", "e.g. 10.0.0.1"),
    ("010.10.0.1", "is not an IP address", "e.g. 10.0.0.1"),
    ("", "is not an IP address", "e.g. 10.0.0.1"),
]


@pytest.mark.parametrize("value, message, fix", CLUSTER_REFUSALS, ids=[c[0] or "empty" for c in CLUSTER_REFUSALS])
def test_check_refuses_each_bad_cluster_address_with_field_value_and_fix(value, message, fix):
    data = two_host()
    data["hosts"]["gpu-a"]["address"] = value
    problem = refusal(data, "hosts.gpu-a.address")
    assert problem.value == value and message in problem.message and fix in problem.fix, problem.line()
    assert problem.line().startswith("error: hosts.gpu-a.address = ")


def test_the_mapped_form_of_another_hosts_address_is_that_address():
    data = two_host()
    data["hosts"]["gpu-a"]["address"] = "::ffff:10.10.0.2"  # gpu-b's address, mapped
    problem = refusal(data, "hosts.gpu-a.address")
    assert "10.10.0.2 in disguise" in problem.message and problem.fix.endswith("10.10.0.2")
    data["hosts"]["gpu-a"]["address"] = "10.10.0.2"  # the fix followed: now plainly gpu-b's
    assert "is already hosts.gpu-a.address" in refusal(data, "hosts.gpu-b.address").message


# (field, value, words of the message) for the listen addresses of a single-host file
LISTEN_REFUSALS = [
    ("router.host", "fe80::1%eth0", "has a zone ID (%eth0)"),
    ("router.prometheus_host", "fe80::1%eth0", "has a zone ID (%eth0)"),
    ("router.prometheus_host", "::1%lo", "has a zone ID (%lo)"),
    ("router.prometheus_host", "fe80::1%$(touch /tmp/x);", "has a zone ID"),
    ("prefill.host", "::ffff:127.0.0.1", "127.0.0.1 in disguise"),
    ("router.host", "::ffff:0.0.0.0", "0.0.0.0 in disguise"),
    ("decode.host", "255.255.255.255", "is the broadcast address"),
    ("router.host", "239.1.2.3", "is a multicast address"),
    ("router.prometheus_host", "fe80::1", "is a link-local address"),
    ("fallback.host", "240.1.2.3", "is a reserved address"),
    ("router.host", "::0", "canonical form (::)"),
    ("router.host", "0:0:0:0:0:0:0:1", "canonical form (::1)"),
    ("router.prometheus_host", "GPU-A.example", "canonical form (gpu-a.example)"),
    # names the resolver reads as IPv4 addresses (inet_aton): addresses in disguise
    ("router.host", "0x7f000001", "takes it for an IPv4 address"),
    ("router.host", "127.1", "takes it for an IPv4 address"),
    ("router.prometheus_host", "010.0.0.1", "takes it for an IPv4 address"),
    ("router.host", "host name", "is neither an IP address nor a host name"),
    ("router.host", "a;b", "is neither an IP address nor a host name"),
    ("router.host", "example.com.", "is neither an IP address nor a host name"),
]


@pytest.mark.parametrize("field, value, message", LISTEN_REFUSALS, ids=[f"{c[0]}={c[1]}" for c in LISTEN_REFUSALS])
def test_check_refuses_each_bad_listen_address_with_field_value_and_fix(field, value, message):
    data = one_host()
    section, key = field.split(".")
    data[section][key] = value
    problem = refusal(data, field)
    assert problem.value == value and message in problem.message and problem.fix, problem.line()


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "gpu-a.example", "10.1.2.3",
                                   "2001:db8::7", "fd00::1", "x1"])
def test_listen_addresses_that_make_sense_are_accepted(value):
    data = one_host()
    data["router"]["prometheus_host"] = value
    assert not [p for p in problems_of(data) if p.field == "router.prometheus_host"]


@pytest.mark.parametrize("host, loopback, wildcard", [
    ("127.0.0.1", True, False), ("127.9.9.9", True, False), ("::1", True, False), ("localhost", True, False),
    ("::ffff:127.0.0.1", True, False), ("::ffff:7f00:1", True, False), ("::1%lo", True, False),
    ("0.0.0.0", False, True), ("::", False, True), ("::ffff:0.0.0.0", False, True), ("::ffff:0:0", False, True),
    ("10.0.0.1", False, False), ("::ffff:10.0.0.1", False, False), ("gpu-a", False, False), ("", False, False),
])
def test_classes_follow_the_address_meant(host, loopback, wildcard):
    assert is_loopback(host) is loopback and verify_is_loopback(host) is loopback
    assert is_wildcard(host) is wildcard


def test_mapped_addresses_take_the_kind_of_their_ipv4_address():
    assert kind_of("::ffff:255.255.255.255") is Kind.BROADCAST
    assert kind_of("::ffff:224.0.0.1") is Kind.MULTICAST
    assert kind_of("::ffff:169.254.0.1") is Kind.LINK_LOCAL
    assert kind_of("gpu-a") is None


def test_a_wildcard_listener_is_reached_over_loopback_of_its_family():
    assert connect_host("0.0.0.0") == "127.0.0.1" and connect_host("::") == "[::1]"
    assert connect_host("::ffff:0.0.0.0") == "127.0.0.1"  # the IPv4 wildcard it means (the schema refuses it)
    assert connect_host("2001:db8::1") == "[2001:db8::1]"


def test_accepted_cluster_addresses_are_canonical_unicast():
    for value in ("10.0.0.1", "192.168.1.20", "100.64.0.1", "8.8.8.8", "2001:db8::1", "fd00::2",
                  "2a00:1450:4001:80e::200e", "3fff::1", "fc00::1"):
        assert cluster_address_problem(value) is None, value


def test_a_bad_address_hides_none_of_the_files_other_problems():
    """The 'checked: nothing' bug: a refused address left the rules unrun."""
    data = two_host()
    data["hosts"]["gpu-a"]["address"] = "fe80::1%eth0"
    data["decode"][0]["gpus"] = [0, 1, 2, 3, 4, 5, 6, 8]  # gpu-b has 8 GPUs, so 8 is beyond it
    data["router"]["port"] = 30002  # the decode server's port on gpu-b
    fields = {p.field for p in problems_of(data)}
    assert {"hosts.gpu-a.address", "decode[0].gpus", "router.port"} <= fields, fields
    # Both addresses bad: still every other rule runs.
    data["hosts"]["gpu-b"]["address"] = "::ffff:127.0.0.1"
    fields = {p.field for p in problems_of(data)}
    assert {"hosts.gpu-a.address", "hosts.gpu-b.address", "decode[0].gpus", "router.port"} <= fields, fields


def test_a_missing_address_is_required():
    data = two_host()
    del data["hosts"]["gpu-a"]["address"]
    problem = refusal(data, "hosts.gpu-a.address")
    assert problem.message == "is required and missing" and "10.0.0.1" in problem.fix


# ---- the rules the NixOS module mirrors, written as it can write them (POSIX regexes over the string, and
# RFC 5952's compression), held against pdserve's own on a corpus of every class

OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{OCTET}(\.{OCTET}){{3}}"
# IPv4 that no field may hold: 0.0.0.0/8 (but 0.0.0.0 for a listener), 169.254/16, 224.0.0.0 and above.
IPV4_UNUSABLE = r"(0\..*|169\.254\..*|(22[4-9]|2[3-5][0-9])\..*)"
IPV4_LOOPBACK = r"127\..*"
# Canonical IPv6 (no zone, lower case) that no field may hold: ::/8 (but :: and ::1 for a listener: wildcard,
# loopback; it holds the mapped ::ffff:0:0/96 too), fe80::/10, fec0::/10 (so fe80-feff) and ff00::/8.
IPV6_UNUSABLE = r"(::.*|[0-9a-f]{1,2}:.*|fe[89a-f][0-9a-f]:.*|ff[0-9a-f]{2}:.*)"
HOST_NAME = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
NUMERIC_LAST_LABEL = r"(.*\.)?([0-9]+|0x[0-9a-f]*)"


def _rfc5952(value: str) -> bool:
    """Whether `value` is an IPv6 address in RFC 5952's form, as Python's ipaddress writes it: lower-case
    groups without leading zeros, the first longest run of two or more zero groups written as ::."""
    if not re.fullmatch(r"[0-9a-f:]+", value) or value.count("::") > 1:
        return False
    head, sep, tail = value.partition("::")
    left = head.split(":") if head else []
    right = tail.split(":") if tail else []
    if not all(re.fullmatch(r"0|[1-9a-f][0-9a-f]{0,3}", g) for g in left + right):
        return False
    missing = 8 - len(left) - len(right)
    if (sep and missing < 2) or (not sep and missing != 0):
        return False
    groups = left + ["0"] * missing + right
    runs = [(i, j) for i in range(8) for j in range(i + 2, 9) if all(g == "0" for g in groups[i:j])]
    best = max((j - i for i, j in runs), default=0)
    first = next(((i, j) for i, j in runs if j - i == best), None)
    if first is None:
        return not sep
    return sep != "" and len(left) == first[0] and len(right) == 8 - first[1]


def mirror_cluster_ok(value: str) -> bool:
    if re.fullmatch(IPV4, value):
        return not re.fullmatch(IPV4_UNUSABLE, value) and not re.fullmatch(IPV4_LOOPBACK, value)
    return _rfc5952(value) and not re.fullmatch(IPV6_UNUSABLE, value)


def mirror_listen_ok(value: str) -> bool:
    if value in ("0.0.0.0", "::", "::1") or (re.fullmatch(IPV4, value) and re.fullmatch(IPV4_LOOPBACK, value)):
        return True
    if re.fullmatch(IPV4, value) or ":" in value:
        return mirror_cluster_ok(value)
    return (len(value) <= 253 and bool(re.fullmatch(HOST_NAME, value))
            and not re.fullmatch(NUMERIC_LAST_LABEL, value))


MIRROR_CORPUS = sorted({c[0] for c in CLUSTER_REFUSALS} | {c[1] for c in LISTEN_REFUSALS} | {
    "10.0.0.1", "192.168.1.20", "100.64.0.1", "8.8.8.8", "1.0.0.1", "223.255.255.254", "126.0.0.1", "128.0.0.1",
    "169.253.0.1", "169.255.0.1", "2001:db8::1", "fd00::2", "fc00::1", "2a00:1450:4001:80e::200e", "3fff::1",
    "100::1", "1ff::1", "fe7f::1", "fe80::", "fec0::", "feff::1", "ff00::1", "fe::1", "ff::1", "64:ff9b::1",
    "2001:db8::1:0:0:1", "2001:db8:0:0:1::1", "2001:0:0:1::1", "2001:db8::", "2001:db8:0:1:1:1:1:1",
    "2001:db8::1:1:1:1:1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "0:0:1::", "::ffff:1.2.3.4",
    "127.0.0.1", "127.255.255.254", "::1", "::", "0.0.0.0", "localhost", "gpu-a", "a.b-c.d", "x.1a", "1x.y",
    "127.0.0.1.nip.io", "a" * 63 + ".b", "a" * 64 + ".b", ("a" * 63 + ".") * 4 + "b", "-a", "a-", "a..b",
})


@pytest.mark.parametrize("value", MIRROR_CORPUS)
def test_the_rules_the_nix_module_mirrors_agree_with_pdserves(value):
    from pdserve.schema.addresses import listen_host_problem

    assert mirror_cluster_ok(value) is (cluster_address_problem(value) is None), value
    assert mirror_listen_ok(value) is (listen_host_problem(value) is None), value
