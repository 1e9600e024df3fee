"""The NixOS module's firewall, without nixpkgs (CI's Nix 2.8): nixos-modules/firewall-rules.nix, the file the
module's firewall.nix imports, evaluated with `nix-instantiate --eval --strict --json` and a builtins-only
`lib` that has the one function it reads (escapeShellArg), written both ways nixpkgs has written it (always
quoted; quoted only when the word needs it).

- Every hostile or odd cluster address is refused by the validation (addresses.nix, the rule `pdserve check`
  applies) with an assertion message naming the option, the value and the fix, and no rule is built at all.
- Valid addresses make iptables commands that `bash -n` accepts and that, run against recording stubs of
  iptables/ip6tables, pass exactly the expected argv (each address one argument); and nftables rules that
  the real `nft -c` loads (PDSERVE_REQUIRE_NFT=1 in CI turns a missing nft into a failure).
- Handed hostile values directly, past the validation, the iptables emitter still carries each as one
  argument and runs nothing of it; the nftables emitter (nft has no quoting) refuses them.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pdserve.schema.loading import deployment_from_data
from tests.fixtures.nft_check import require_nft
from tests.nix.firewall_cases import (
    HOSTILE,
    VALID,
    VALID_V4,
    VALID_V6,
    expected_argv,
    expected_firewall,
    spellings,
    verdict,
)
from tests.nix.test_nix import REPO, SCHEMA, TIMEOUT, nix_eval, nix_instantiate
from tests.nix.test_nix_hosts import example, nix_json

FIREWALL = REPO / "nixos-modules" / "firewall-rules.nix"
MODULE = REPO / "nixos-modules" / "firewall.nix"  # the module's firewall file

# Two builtins-only stand-ins for nixpkgs' lib.escapeShellArg: older nixpkgs quoted every word, newer
# leaves a word of only safe characters bare. The firewall must be right with either.
LIBS = {
    "always-quoted": """{ escapeShellArg = a:
        "'" + builtins.replaceStrings [ "'" ] [ "'\\\\''" ] (toString a) + "'"; }""",
    "quoted-when-needed": """{ escapeShellArg = a: let s = toString a; in
        if builtins.match "[[:alnum:],._+:@%/-]+" s != null then s
        else "'" + builtins.replaceStrings [ "'" ] [ "'\\\\''" ] s + "'"; }""",
}


def firewall_nix(lib: str = "always-quoted") -> str:
    return f"(import {FIREWALL} {{ lib = {LIBS[lib]}; }})"


def build(deployments: dict[str, Any], host: str, lib: str = "always-quoted", open_to_peers: bool = True) -> Any:
    return nix_eval(f"{firewall_nix(lib)}.build {{ schema = builtins.fromJSON (builtins.readFile {SCHEMA}); "
                    f"deployments = {nix_json(deployments)}; host = \"{host}\"; "
                    f"openToPeers = {'true' if open_to_peers else 'false'}; }}")


def with_address(data: dict[str, Any], host: str, address: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    changed["hosts"][host]["address"] = address
    return changed


def mixed_families() -> dict[str, Any]:
    """The four-host example with gpu-d on IPv6: gpu-c opens dist-init to it over ip6, gpu-a and gpu-b open
    their bootstrap ports to gpu-c (IPv4) and gpu-d (IPv6) at once."""
    return with_address(example("four-host"), "gpu-d", VALID_V6)


# --- hostile values stop the firewall -------------------------------------------------------------

@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_address_is_an_assertion_and_no_rule(case: str):
    value = HOSTILE[case]
    built = build({"cluster": with_address(example("four-host"), "gpu-d", value)}, "gpu-c")
    (message,) = built["problems"]
    path = "services.pdserve.deployments.cluster.settings.hosts.gpu-d.address"
    assert message.startswith(f"{path} = {json.dumps(value)} "), message
    assert f'Write\n{path} = "' in message and "No firewall rule is built from it." in message
    # The value is shown JSON-quoted (newline escaped) and nowhere raw: the message is one paragraph.
    assert "pwned" not in message.replace(json.dumps(value), "")
    assert built["firewalls"] == [] and built["nftRules"] == [] and built["iptablesRules"] == []


def test_a_hostile_address_elsewhere_stops_every_deployments_rules():
    """No half-applied firewall: one bad address in one deployment, and neither deployment gets a rule."""
    good = example("two-host")
    bad = {**with_address(example("two-host"), "gpu-a", HOSTILE["semicolon"]), "name": "other"}
    built = build({"a": good, "b": bad}, "gpu-b")
    (message,) = built["problems"]
    assert message.startswith("services.pdserve.deployments.b.settings.hosts.gpu-a.address = ")
    assert built["firewalls"] == [] and built["iptablesRules"] == [] and built["nftRules"] == []
    assert build({"a": good}, "gpu-b")["iptablesRules"] != []  # ... which the good one alone has


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("prefill[0].name", "a\nx", 'prefill[0].name = "a\\nx" is not a name pdserve can use'),
    ("prefill[0].bootstrap_port", "8999; touch pwned", "prefill[0].bootstrap_port = \"8999; touch"),
    ("decode[0].dist_init_port", 65533,
     "decode[0].dist_init_port = 65533: with the ports SGLang binds above it the range reaches\n65539, beyond 65535"),
])
def test_a_hostile_name_or_port_is_an_assertion_and_no_rule(field: str, value: Any, expected: str):
    """Names reach the rules' comments, ports the rules: both are validated like addresses."""
    data = example("four-host")
    role, key = field.split(".")
    data[role[:-3]][int(role[-2])][key] = value
    host = "gpu-a" if role.startswith("prefill") else "gpu-c"
    built = build({"dsv4": data}, host)
    assert any(f"services.pdserve.deployments.dsv4.settings.{expected}" in m for m in built["problems"]), built
    assert any(f"Write e.g. services.pdserve.deployments.dsv4.settings.{field} = " in m for m in built["problems"])
    assert built["iptablesRules"] == [] and built["nftRules"] == []


# --- valid addresses: real consumers ---------------------------------------------------------------

def every_valid_spelling() -> dict[str, Any]:
    """The four-host example on the other valid addresses: a compressed run at the end, none, one inside."""
    data = example("four-host")
    for host, address in zip(["gpu-a", "gpu-b", "gpu-c", "gpu-d"], VALID[2:], strict=True):
        data["hosts"][host]["address"] = address
    return data


CASES = {"two-host": example("two-host"), "four-host": example("four-host"), "mixed-families": mixed_families(),
         "every-valid-spelling": every_valid_spelling()}
HOSTS = [(case, host) for case, data in CASES.items() for host in data["hosts"]]


def run_with_stubs(script: str, tmp_path: Path) -> list[list[str]]:
    """`script` checked by `bash -n`, then run by bash with iptables and ip6tables replaced by stubs that
    record their argv (NUL-separated, so any byte but NUL comes back as it was passed)."""
    path = tmp_path / "extra-commands.sh"
    path.write_text(script + "\n", encoding="utf-8")
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert checked.returncode == 0, checked.stderr
    stubs, record = tmp_path / "stubs", tmp_path / "argv.bin"
    stubs.mkdir()
    for tool in ("iptables", "ip6tables"):
        stub = stubs / tool
        stub.write_text('#!/bin/bash\nprintf \'%s\\0\' "${0##*/}" "$#" "$@" >> "$PDSERVE_STUB_RECORD"\n',
                        encoding="utf-8")
        stub.chmod(0o755)
    work = tmp_path / "cwd"
    work.mkdir()
    ran = subprocess.run(["bash", "-e", str(path)], capture_output=True, text=True, timeout=TIMEOUT, cwd=work,
                         env={"PATH": f"{stubs}:{os.environ['PATH']}", "PDSERVE_STUB_RECORD": str(record)})
    assert ran.returncode == 0, ran.stderr
    # The hostile cases `touch pwned` here if any of their text runs as code.
    assert list(work.iterdir()) == [], "the commands made files"
    fields = record.read_bytes().decode().split("\0")[:-1] if record.exists() else []
    calls = []
    while fields:
        name, count = fields[0], int(fields[1])
        calls.append([name, *fields[2:2 + count]])
        fields = fields[2 + count:]
    return calls


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(("case", "host"), HOSTS, ids=[f"{c}-{h}" for c, h in HOSTS])
def test_the_iptables_commands_pass_exactly_the_expected_argv(case: str, host: str, lib: str, tmp_path: Path):
    data = CASES[case]
    built = build({"dsv4": data}, host, lib)
    assert built["problems"] == []
    dep = deployment_from_data(copy.deepcopy(data), "<case>").deployment
    assert built["firewalls"] == [expected_firewall(dep, host)]
    calls = run_with_stubs("\n".join(built["iptablesRules"]), tmp_path)
    assert calls == expected_argv(built["firewalls"])
    assert calls, "the case opens nothing: it tests nothing"


def test_the_cases_cover_both_families_ranges_and_several_sources():
    built = [build({"dsv4": CASES[case]}, host)["firewalls"] for case, host in HOSTS]
    rules = [r for records in built for f in records for r in f["opened"]]
    sources = [s for r in rules for s in r["sources"]]
    assert VALID_V6 in sources and VALID_V4 in sources
    assert any(r["first"] < r["last"] for r in rules)
    assert any({ipaddress.ip_address(s).version for s in r["sources"]} == {4, 6} for r in rules)


def nft_check(rules: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The rules as NixOS puts extraInputRules: inside an input chain of an inet table."""
    body = "\n".join(f"\t\t{rule}" for rule in rules)
    ruleset = tmp_path / "rules.nft"
    ruleset.write_text("table inet pdserve_module_check {\n\tchain input {\n"
                       "\t\ttype filter hook input priority filter; policy accept;\n"
                       f"{body}\n\t}}\n}}\n", encoding="utf-8")
    return subprocess.run(["nft", "-c", "-f", str(ruleset)], capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)


@pytest.mark.parametrize(("case", "host"), HOSTS, ids=[f"{c}-{h}" for c, h in HOSTS])
def test_the_nftables_rules_pass_the_real_nft_check(case: str, host: str, tmp_path: Path):
    require_nft()
    rules = build({"dsv4": CASES[case]}, host)["nftRules"]
    assert any("saddr" in rule for rule in rules)
    done = nft_check(rules, tmp_path)
    assert done.returncode == 0, (rules, done.stderr)


@functools.cache
def accepted_corpus() -> tuple[dict[str, Any], Any]:
    """Every address of a seeded corpus that the rule accepts, each a peer's address (gpu-d) in a deployment
    of its own, all built on one host (gpu-c): the deployments and what firewall-rules.nix builds of them."""
    base = example("four-host")
    taken = {spec["address"] for spec in base["hosts"].values()}
    values = sorted({v for v in spellings(seed=40, count=400) if verdict(v) is None} - taken)
    assert len(values) > 30
    deployments = {f"d{i}": {**with_address(base, "gpu-d", v), "name": f"d{i}"} for i, v in enumerate(values)}
    return deployments, build(deployments, "gpu-c")


def test_every_accepted_spelling_makes_the_commands_expected():
    deployments, built = accepted_corpus()
    assert built["problems"] == []
    # build orders deployments by attribute name (d0, d1, d10, ...), as the module's attrNames does.
    assert built["firewalls"] == [
        expected_firewall(deployment_from_data(copy.deepcopy(deployments[name]), name).deployment, "gpu-c")
        for name in sorted(deployments)]


def test_every_accepted_spelling_passes_exactly_the_expected_argv(tmp_path: Path):
    _, built = accepted_corpus()
    assert run_with_stubs("\n".join(built["iptablesRules"]), tmp_path) == expected_argv(built["firewalls"])


def test_every_accepted_spelling_passes_the_real_nft_check(tmp_path: Path):
    require_nft()
    _, built = accepted_corpus()
    done = nft_check(built["nftRules"], tmp_path)
    assert done.returncode == 0, done.stderr


def test_nft_refuses_what_the_validation_keeps_out(tmp_path: Path):
    """The check can fail: a zone ID, as the module pasted it before, is a ruleset nft does not load."""
    require_nft()
    rules = build({"dsv4": mixed_families()}, "gpu-c")["nftRules"]
    assert nft_check(rules, tmp_path).returncode == 0
    broken = [rule.replace(VALID_V6, "fe80::1%eth0") for rule in rules]
    assert broken != rules and nft_check(broken, tmp_path).returncode != 0


# --- the emitters alone, handed what the validation refuses ----------------------------------------

def hostile_records(value: str) -> list[dict[str, Any]]:
    return [{"deployment": "dsv4", "opened": [{"first": 5000, "last": 5006, "purpose": "decode-1 dist-init",
                                               "sources": [value]}],
             "closed": [{"first": 30000, "last": 30000}, {"first": 5000, "last": 5006}], "peers": [value]}]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("case", ["semicolon", "command substitution in a zone ID", "command substitution",
                                  "backticks", "single quote", "double quote", "newline", "nft set break-out"])
def test_the_iptables_emitter_carries_any_value_as_one_argument(case: str, lib: str, tmp_path: Path):
    """Past the validation too, lib.escapeShellArg keeps each value one word: nothing in it runs."""
    value = HOSTILE[case]
    records = hostile_records(value)
    lines = nix_eval(f"{firewall_nix(lib)}.emit.iptablesRules {nix_json(records)}")
    calls = run_with_stubs("\n".join(lines), tmp_path)  # ... which also holds that no `touch pwned` ran
    tool = "ip6tables" if ":" in value else "iptables"
    assert calls == [
        [tool, "-A", "nixos-fw", "-p", "tcp", "-s", value, "--dport", "5000:5006", "-j", "nixos-fw-accept"],
        [tool, "-A", "nixos-fw", "-p", "tcp", "-s", value, "-m", "multiport", "--dports", "30000,5000:5006", "-j",
         "DROP"],
        [tool, "-A", "nixos-fw", "-s", value, "-j", "nixos-fw-accept"],
    ]


def emitter_refuses(emitter: str, records: list[dict[str, Any]]) -> str:
    """The error of an emitter handed `records`: its evaluation must fail (a throw, not a rule)."""
    result = subprocess.run(
        [nix_instantiate(), "--eval", "--strict", "--json", "-E",
         f"{firewall_nix()}.emit.{emitter} {nix_json(records)}"],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert result.returncode != 0, result.stdout
    return result.stderr


@pytest.mark.parametrize("case", ["zone ID", "newline", "nft set break-out", "IPv4-mapped loopback"])
def test_the_nftables_emitter_refuses_an_unvalidated_address(case: str):
    assert "reached the nftables rules unvalidated" in emitter_refuses("nftRules", hostile_records(HOSTILE[case]))


@pytest.mark.parametrize("emitter", ["iptablesRules", "nftRules"])
def test_a_comment_never_holds_a_line_break(emitter: str):
    """A comment ends at the line's end in both languages: text with a newline would be a command or a rule."""
    records = hostile_records(VALID_V4)
    records[0]["opened"][0]["purpose"] = "decode-1\ntouch pwned"
    assert "unsafe comment" in emitter_refuses(emitter, records)


@pytest.mark.parametrize("emitter", ["iptablesRules", "nftRules"])
def test_a_port_that_is_not_an_integer_never_reaches_a_rule(emitter: str):
    records = hostile_records(VALID_V4)
    records[0]["closed"][0]["first"] = records[0]["closed"][0]["last"] = "30000;touch pwned"
    assert "is not a port" in emitter_refuses(emitter, records)


# --- the module runs this file -------------------------------------------------------------------------

def test_the_module_builds_its_firewall_with_this_file_only():
    """The module's rules and assertions are firewall-rules.nix's (with nixpkgs' lib): no rule text of its own."""
    text = MODULE.read_text(encoding="utf-8")
    assert "(import ./firewall-rules.nix { inherit lib; }).build {" in text
    assert "inherit (firewall) firewalls nftRules iptablesRules;" in text
    assert "}) firewall.problems" in text
    assert "extraInputRules = lib.mkIf (nftables && nftRules != [ ]) (lib.concatStringsSep \"\\n\" nftRules);" in text
    for path in (REPO / "nixos-modules").glob("*.nix"):
        if path != FIREWALL:
            module_file = path.read_text(encoding="utf-8")
            assert "nixos-fw" not in module_file and "saddr" not in module_file, path.name
