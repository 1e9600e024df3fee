"""The nftables emitter (pdserve.render.emit.nft) and the firewall renderer through it: every address `check`
accepts renders a ruleset the real `nft -c` loads; every address it cannot carry is refused by `check` first;
no value ends a comment and starts a rule."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from pdserve.render.emit import EmitError, nft
from pdserve.render.firewall import render_firewall
from pdserve.render.renderable import renderable_from_data
from pdserve.schema.problems import ConfigError
from tests.fixtures.nft_check import require_nft

ROOT = Path(__file__).resolve().parents[2]
TWO_HOST = ROOT / "hosts/two-host/deployment.toml"
FOUR_HOST = ROOT / "hosts/four-host/deployment.toml"
NFT_TIMEOUT = 30

# Addresses as a careless or hostile user writes them: plain ones of every family and range, and every class
# the address model knows. `check` decides; the test holds that what it accepts loads.
CANDIDATES = [
    "10.10.0.9", "192.168.7.1", "172.16.0.1", "100.64.0.1", "8.8.4.4", "198.51.100.7", "1.1.1.1",
    "2001:db8::9", "fd00::9", "fc00::1", "2a00:1450:4001:80e::200e", "3fff::1", "2001:db8:1:2:3:4:5:6",
    "fe80::1%eth0", "fe80::1%$(touch /tmp/x);", "2001:db8::9%eth0", "10.10.0.9%eth0",
    "::ffff:0.0.0.0", "::ffff:127.0.0.1", "::ffff:10.10.0.1", "::ffff:10.10.0.9",
    "255.255.255.255", "224.0.0.1", "ff02::1", "fe80::1", "169.254.1.1", "fec0::1", "::a0a:9", "240.0.0.9",
    "127.0.0.1", "::1", "0.0.0.0", "::", "2001:DB8::9", "2001:db8:0:0:0:0:0:9", "gpu-a.example", "10.10.0.9 ",
]


@pytest.fixture(scope="module")
def nft_check():
    require_nft()

    def check(ruleset: str) -> subprocess.CompletedProcess:
        return subprocess.run(["nft", "-c", "-f", "-"], input=ruleset, capture_output=True, text=True,
                              timeout=NFT_TIMEOUT, check=False)

    return check


def _with_address(value: str) -> dict:
    data = tomllib.loads(TWO_HOST.read_text())
    data["hosts"]["gpu-b"]["address"] = value  # the decode's host: gpu-a's ruleset opens its ports to it
    return data


def test_every_address_check_accepts_loads_in_nft_and_every_other_is_refused(nft_check):
    accepted = []
    for value in CANDIDATES:
        try:
            dep = renderable_from_data(_with_address(value), "test").deployment
        except ConfigError as exc:
            bad = [p for p in exc.problems if p.field == "hosts.gpu-b.address"]
            assert bad and bad[0].value == value and bad[0].fix, (value, [p.line() for p in exc.problems])
            continue
        accepted.append(value)
        for host in dep.hosts:
            ruleset = render_firewall(dep, host)
            done = nft_check(ruleset)
            assert done.returncode == 0, (value, host, done.stderr, ruleset)
        assert f"saddr {{ {value} }} accept" in render_firewall(dep, "gpu-a")  # the prefill's ports, to gpu-b
    # The test can fail both ways: it saw plain addresses of both families accepted, and the hostile ones not.
    assert {"10.10.0.9", "2001:db8::9", "fd00::9"} <= set(accepted)
    assert not {"fe80::1%eth0", "fe80::1%$(touch /tmp/x);", "::ffff:0.0.0.0", "255.255.255.255"} & set(accepted)


def test_the_examples_rulesets_load(nft_check):
    for path in (TWO_HOST, FOUR_HOST):
        dep = renderable_from_data(tomllib.loads(path.read_text()), str(path)).deployment
        for host in dep.hosts:
            done = nft_check(render_firewall(dep, host))
            assert done.returncode == 0, (path, host, done.stderr)


def test_a_zoned_address_that_reached_the_renderer_would_not_load(nft_check):
    """Why `check` refuses it: nft reads the zone ID as junk (the issue's 'firewall that does not load')."""
    done = nft_check("table inet t {\n\tchain c {\n\t\tip6 saddr { fe80::1%eth0 } accept\n\t}\n}\n")
    assert done.returncode != 0


@pytest.mark.parametrize("value", ["fe80::1%eth0", "::ffff:10.0.0.1", "2001:DB8::1", "gpu-a", "", "10.0.0.1 ",
                                   "10.0.0.1; flush ruleset"])
def test_the_emitter_refuses_what_is_no_plain_canonical_address(value):
    with pytest.raises(EmitError):
        nft.address(value)


def test_the_emitter_writes_addresses_ports_and_names():
    assert nft.address("2001:db8::1") == "2001:db8::1" and nft.family("2001:db8::1") == "ip6"
    assert nft.family("10.0.0.1") == "ip"
    assert nft.port_range(5000, 5006) == "5000-5006" and nft.port_range(8998, 8998) == "8998"
    assert nft.anonymous_set(["10.0.0.1", "10.0.0.2"]) == "{ 10.0.0.1, 10.0.0.2 }"
    for bad in (0, 65536, True, "22"):
        with pytest.raises(EmitError):
            nft.port(bad)  # type: ignore[arg-type]
    with pytest.raises(EmitError):
        nft.port_range(10, 9)
    with pytest.raises(EmitError):
        nft.anonymous_set([])
    for bad in ("pdserve-x", "x y", "", "1abc", "x;"):
        with pytest.raises(EmitError):
            nft.identifier(bad)
    assert nft.string("lo") == '"lo"'
    for bad in ('lo" accept', "a\\b", "", "x" * 16):
        with pytest.raises(EmitError):
            nft.string(bad)


@pytest.mark.parametrize("text", ["a\ntcp dport 1 drop junk", "a\r\ntable inet evil {}", "a\x85b\u2028c\x00d",
                                  "back\\slash\nx"])
def test_a_comment_is_one_line_whatever_it_holds(nft_check, text):
    line = nft.comment(text, "\t\t")
    assert "\n" not in line and "\r" not in line and line.startswith("\t\t# ")
    # nft loads it: were the value to end the comment, the junk after it would be refused.
    ruleset = f"table inet t {{\n\tchain c {{\n{line}\n\t\taccept\n\t}}\n}}\n"
    done = nft_check(ruleset)
    assert done.returncode == 0, (done.stderr, ruleset)
    assert nft_check(ruleset.replace(line, "\t\t# a\n\t\tjunk here")).returncode != 0  # the check can fail
