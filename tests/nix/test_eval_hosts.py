"""The evaluation tier for the multi-host examples (marker nix_eval): every nixosConfigurations.<example>-<host>
evaluates against the real nixpkgs with no warning and no failed assertion, and each host's system is what
pdserve makes of the deployment for that host: exactly its units (pdserve.schema.topology), rendered by
`pdserve render --host <host>`, wanted at boot; its worker ports opened to exactly the cluster addresses of
the hosts that must reach them (pdserve.schema.listeners), as iptables or nftables rules; the router's port
published only where the router runs; a host name the deployment lacks refused with the line to write.
Needs what tests/nix/test_eval.py needs (PDSERVE_EVAL_*); nothing is built."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest

from pdserve.render.firewall import render_firewall
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.topology import nodes_on, router_hosts, router_unit, server_unit
from tests.nix.firewall_cases import expected_argv, expected_firewall
from tests.nix.test_eval import REPO, Evaluator, evaluator
from tests.nix.test_nix_hosts import EXAMPLES, example

pytestmark = pytest.mark.nix_eval

CASES = REPO / "tests" / "nix" / "eval-hosts.nix"
HOSTS = [(name, host) for name in EXAMPLES for host in example(name)["hosts"]]
SYSTEMS = [f"{name}-{host}" for name, host in HOSTS]


@pytest.fixture(scope="module")
def nix() -> Evaluator:
    return evaluator()


@pytest.fixture(scope="module")
def systems(nix: Evaluator) -> dict[str, Any]:
    """Every example host's summary (eval-hosts.nix), in one evaluation."""
    return nix.json("--impure", ".#nixosConfigurations", "--apply", f"configs: import {CASES} {{ inherit configs; }}")


def deployment(summary: dict[str, Any]):
    (settings,) = summary["settings"].values()
    return deployment_from_data(copy.deepcopy(settings), "<evaluated settings>").deployment


def test_the_flake_has_one_system_per_example_host(systems):
    assert sorted(systems) == sorted(SYSTEMS)


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_each_host_evaluates_without_warnings_or_failed_assertions(systems, name, host):
    summary = systems[f"{name}-{host}"]
    assert summary["failed"] == [] and summary["warnings"] == []
    assert summary["host"] == host
    assert re.fullmatch(rf"/nix/store/[a-z0-9]{{32}}-nixos-system-{host}-.+\.drv", summary["toplevel"])
    # The settings are the example's file as pdserve reads it (the module's defaults add nothing it lacks).
    assert deployment(summary) == deployment_from_data(example(name), "<example>").deployment


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_each_host_declares_exactly_the_units_pdserve_places_on_it(systems, name, host):
    summary = systems[f"{name}-{host}"]
    dep = deployment(summary)
    placed = {server_unit(dep, node): node.server.role for node in nodes_on(dep, host)}
    if host in router_hosts(dep):
        placed[router_unit(dep, host)] = "router"
    assert set(summary["units"]) == set(placed)
    for unit, role in placed.items():
        declared = summary["units"][unit]
        assert "multi-user.target" in declared["wantedBy"], unit  # boot_layout pd: every unit boots
        assert ("TRITON_LIBCUDA_PATH" in declared["environment"]) is (role != "router"), unit
        if role != "router":
            # NixOS writes PATH over the rendered unit's: the SGLang env's bin must still come first.
            assert declared["environment"]["PATH"].split(":")[0] == summary["sglangBin"], unit
        # No sandbox or command of the module's own: the rendered unit files carry both.
        assert not {"ExecStart", "ProtectSystem", "User"} & set(declared["serviceConfig"]), unit


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_the_units_are_rendered_for_this_host(nix: Evaluator, systems, name, host):
    (drv,) = systems[f"{name}-{host}"]["renderedUnits"]
    (units,) = json.loads(nix.run("derivation", "show", drv).stdout).values()
    command = units["env"]["buildCommand"]
    assert re.search(rf"pdserve render -c /nix/store/\S+ --out \S+ \\\s+"
                     rf"--config-path /nix/store/\S+ --host '?{host}'? ",
                     command), command


def _ports(rule: dict[str, Any], separator: str) -> str:
    return str(rule["first"]) if rule["first"] == rule["last"] else f"{rule['first']}{separator}{rule['last']}"


def rules(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")
            and ("nixos-fw" in line or "saddr" in line)]


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_the_firewall_opens_each_worker_port_to_exactly_the_hosts_that_use_it(systems, name, host):
    summary = systems[f"{name}-{host}"]
    dep = deployment(summary)
    (expected,) = summary["firewall"]
    assert expected == expected_firewall(dep, host)
    peers, closed = expected["peers"], expected["closed"]
    # As the shell reads them (nixpkgs' lib.escapeShellArg quotes a word or leaves a safe one bare).
    assert [shlex.split(line) for line in rules(summary["extraCommands"])] == expected_argv([expected])
    assert rules(summary["nftables"]["extraInputRules"]) == [
        *(f"ip saddr {{ {', '.join(rule['sources'])} }} tcp dport {_ports(rule, '-')} accept"
          for rule in expected["opened"]),
        f"ip saddr {{ {', '.join(peers)} }} tcp dport {{ {', '.join(_ports(r, '-') for r in closed)} }} drop",
        f"ip saddr {{ {', '.join(peers)} }} accept",
    ]
    assert summary["nftables"]["failed"] == [] and summary["nftables"]["warnings"] == []
    assert "nixos-fw" not in summary["nftables"]["extraCommands"]
    # The router's port is published (openFirewall) where the router runs, and nowhere else.
    assert (dep.router.port in summary["allowedTCPPorts"]) is (host in router_hosts(dep))


NFT_ACCEPT = re.compile(r"^\s*tcp dport (\S+) ip6? saddr \{ ([^}]*) \} accept$", re.M)
NFT_DROP = re.compile(r"^\s*tcp dport \{ ([^}]*) \} counter drop$", re.M)


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_the_module_opens_what_pdserve_renders_for_the_host(systems, name, host):
    """The same ports to the same hosts as the ruleset `pdserve render --host` writes for hosts without NixOS
    (which leaves every other port to the host's own policy; on NixOS that is openToPeers)."""
    summary = systems[f"{name}-{host}"]
    dep = deployment(summary)
    (module,) = summary["firewall"]
    rendered = render_firewall(dep, host)
    assert sorted((ports, sorted(s.strip() for s in sources.split(",")))
                  for ports, sources in NFT_ACCEPT.findall(rendered)) \
        == sorted((_ports(rule, "-"), sorted(rule["sources"])) for rule in module["opened"])
    (dropped,) = NFT_DROP.findall(rendered)
    assert sorted(p.strip() for p in dropped.split(",")) == sorted(_ports(rule, "-") for rule in module["closed"])


def test_the_firewall_cases_cover_ranges_and_several_sources(systems):
    """The examples hold a dist-init range (four-host gpu-c) and a port two hosts reach (four-host's
    bootstrap ports): the comparisons above are not about single ports only."""
    opened = [rule for summary in systems.values() for f in summary["firewall"] for rule in f["opened"]]
    assert any(rule["first"] < rule["last"] for rule in opened)
    assert any(len(rule["sources"]) > 1 for rule in opened)


@pytest.mark.parametrize(("name", "host"), HOSTS, ids=SYSTEMS)
def test_the_units_derivation_installs_exactly_the_declared_units(nix: Evaluator, systems, name, host, tmp_path):
    """The install lines of the host's units derivation, run (with bash, as its builder would) on what
    `pdserve render --host` writes for the evaluated settings: the unit files it ships are exactly the
    units the module declares (wantedBy, environment), the firewall file goes to share/pdserve."""
    summary = systems[f"{name}-{host}"]
    (drv,) = summary["renderedUnits"]
    (units,) = json.loads(nix.run("derivation", "show", drv).stdout).values()
    command = units["env"]["buildCommand"]
    install = command[command.index("mkdir -p $out/lib/systemd/system"):]
    assert "/nix/store/" not in install, install
    settings = tmp_path / "settings.json"
    (data,) = summary["settings"].values()
    settings.write_text(json.dumps(data), encoding="utf-8")
    work, out = tmp_path / "build", tmp_path / "out"
    work.mkdir()
    rendered = subprocess.run(
        [sys.executable, "-m", "pdserve.cli.main", "render", "-c", str(settings), "--out", str(work / "units"),
         "--host", host, "--sglang-python", sys.executable, "--numactl", "/bin/true", "--pdserve", "/bin/true"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", install], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "TMPDIR": str(work), "out": str(out)})
    assert ran.returncode == 0, ran.stderr
    shipped = sorted(p.name.removesuffix(".service") for p in (out / "lib/systemd/system").iterdir())
    assert shipped == sorted(summary["units"])
    assert (out / "share/pdserve" / f"pdserve-{data['name']}-firewall.nft").is_file()
    assert not list((work / "units").rglob("*.*")), "something pdserve rendered was left behind"


@pytest.mark.parametrize(("name", "host"), HOSTS[:1], ids=SYSTEMS[:1])
def test_a_host_the_deployment_lacks_fails_with_the_line_to_write(systems, name, host):
    (message,) = systems[f"{name}-{host}"]["elsewhere"]
    text = " ".join(message.split())
    hosts = ", ".join(example(name)["hosts"])
    assert f"is a multi-host deployment of the hosts {hosts}" in text
    assert 'services.pdserve.host = "not-a-host" is none of them.' in text
    assert f'Write services.pdserve.host = "{next(iter(example(name)["hosts"]))}";' in text


def test_a_hostile_cluster_address_is_refused_and_builds_no_rule(systems):
    """Issue 37: another host's address with shell code in its zone ID, as the real module evaluates it with the
    real nixpkgs: one assertion naming the option, the value (JSON-quoted) and the fix; no firewall rule in
    extraCommands (run as root) or extraInputRules. tests/nix/test_firewall_nix.py holds every other class."""
    hostile = systems["four-host-gpu-c"]["hostile"]
    path = f"services.pdserve.deployments.{hostile['attrName']}.settings.hosts.{hostile['peer']}.address"
    (message,) = hostile["failed"]
    assert message.startswith(f"{path} = {json.dumps(hostile['address'])} has a zone ID"), message
    assert f'Write\n{path} = "10.0.0.1";' in message and "No firewall rule is built from it." in message
    assert hostile["firewall"] == []
    for text in (hostile["extraCommands"], hostile["extraInputRules"]):
        assert "pwned" not in text and "# pdserve" not in text and "saddr" not in text, text
