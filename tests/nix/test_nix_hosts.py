"""The NixOS module's view of a multi-host deployment, without nixpkgs (CI's Nix 2.8): derived.nix names
each host's units and lists each host's listeners (with the hosts that must reach them) exactly as pdserve
does (pdserve.schema.topology, pdserve.schema.listeners), for every host of the examples under hosts/ and
for variants that exercise the naming rules. The module installs those units and opens those ports; the
evaluation tier (tests/nix/test_eval_hosts.py) holds the evaluated systems against the same functions."""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import asdict
from typing import Any

import pytest

from pdserve.schema.listeners import listeners_on
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.placement import place
from pdserve.schema.topology import nodes_on, router_hosts, router_unit, server_unit
from tests.nix.test_nix import DERIVED, REPO, SCHEMA, nix_eval

EXAMPLES = ["two-host", "four-host"]


def example(name: str) -> dict[str, Any]:
    return tomllib.loads((REPO / "hosts" / name / "deployment.toml").read_text(encoding="utf-8"))


def variant() -> dict[str, Any]:
    """The four-host example with the naming rules' other branches: routers on two hosts (each unit adds
    its host), a named server, a prefill's own bootstrap port, no [transfer] (its defaults)."""
    data = copy.deepcopy(example("four-host"))
    data["router"]["hosts"] = ["gpu-c", "gpu-a"]
    data["prefill"][1]["name"] = "prefill-big"
    data["prefill"][1]["bootstrap_port"] = 8999
    data.pop("transfer")
    data["decode"][0]["ib_devices"] = ["mlx5_0"]
    data["prefill"][0]["ib_devices"] = ["mlx5_0"]
    data["prefill"][1]["ib_devices"] = ["mlx5_0"]
    return data


CASES = {**{name: example(name) for name in EXAMPLES}, "four-host-variant": variant()}


def nix_json(value: Any) -> str:
    return f"(builtins.fromJSON {json.dumps(json.dumps(value))})"


def python_units(data: dict[str, Any], host: str) -> dict[str, str]:
    dep = deployment_from_data(copy.deepcopy(data), "<case>").deployment
    units = {server_unit(dep, node): node.server.role for node in nodes_on(dep, host)}
    if host in router_hosts(dep):
        units[router_unit(dep, host)] = "router"
    return units


@pytest.mark.parametrize("case", CASES)
def test_nix_places_the_units_on_each_host_as_pdserve_does(case: str) -> None:
    data = CASES[case]
    for host in data["hosts"]:
        from_nix = nix_eval(f'(import {DERIVED}).hostUnits {nix_json(data)} "{host}"')
        assert from_nix == python_units(data, host), host
        # ... which are exactly the unit files `pdserve render --host` writes there.
        dep = deployment_from_data(copy.deepcopy(data), "<case>").deployment
        assert sorted(from_nix) == sorted(place(dep).units(host)), host
    assert nix_eval(f"(import {DERIVED}).multiHost {nix_json(data)}") is True


@pytest.mark.parametrize("case", CASES)
def test_nix_lists_each_hosts_listeners_as_pdserve_does(case: str) -> None:
    """Ports, ranges (dist-init), the fields that set them, and who must reach each one: what the module's
    firewall opens and its collision assertion compares."""
    data = CASES[case]
    dep = deployment_from_data(copy.deepcopy(data), "<case>").deployment
    for host in data["hosts"]:
        expected = [{**asdict(item), "reached_from": list(item.reached_from)} for item in listeners_on(dep, host)]
        from_nix = nix_eval(f"(import {DERIVED}).hostListeners (builtins.fromJSON (builtins.readFile {SCHEMA})) "
                            f'{nix_json(data)} "{host}"')
        assert from_nix == expected, host


def test_the_variant_exercises_what_the_examples_do_not() -> None:
    units = python_units(CASES["four-host-variant"], "gpu-a")
    assert "sglang-dsv4-router-gpu-a" in units  # a router per host, each named for its host
    assert "sglang-dsv4-prefill-big" in python_units(CASES["four-host-variant"], "gpu-b")


def test_a_single_host_file_is_not_multi_host() -> None:
    reference = tomllib.loads((REPO / "hosts" / "gpu-host" / "deployment.toml").read_text(encoding="utf-8"))
    assert nix_eval(f"(import {DERIVED}).multiHost {nix_json(reference)}") is False


def test_every_host_of_each_example_has_its_configuration() -> None:
    """The flake makes nixosConfigurations.<example>-<host> from hosts/<example>/<host>/configuration.nix for
    every [hosts.<host>]: a host without its file would fail the whole flake's evaluation."""
    for name in EXAMPLES:
        for host in example(name)["hosts"]:
            path = REPO / "hosts" / name / host / "configuration.nix"
            assert path.is_file(), f"{path.relative_to(REPO)} is missing"
            text = path.read_text(encoding="utf-8")
            # hosts/example-node.nix takes the name for networking.hostName, services.pdserve.host and the
            # cluster address ([hosts.<name>].address of the same deployment file).
            assert f'name = "{host}";' in text and "deploymentFile = ../deployment.toml;" in text
            assert (path.parent / "hardware-configuration.nix").is_file()
    node = (REPO / "hosts" / "example-node.nix").read_text(encoding="utf-8")
    assert "networking.hostName = name;" in node and "host = name;" in node
    assert "deployment.hosts.${name}" in node


def test_derived_nix_dist_init_span_is_pdserves() -> None:
    from pdserve.schema.topology import DIST_INIT_SPAN

    assert nix_eval(f"(import {DERIVED}).distInitSpan") == DIST_INIT_SPAN
