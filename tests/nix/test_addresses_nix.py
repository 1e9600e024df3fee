"""The cluster-address rule of the NixOS module (nixos-modules/addresses.nix), without nixpkgs (CI's Nix 2.8):
it refuses every hostile and odd address for its reason and takes the valid ones; over a seeded corpus of
spellings (compressed anywhere, exploded, upper case, leading zeros, IPv4 tails, mapped, near misses) its
verdict is the rule's, computed with Python's ipaddress, with Python's canonical spelling as the fix; and it
accepts exactly what `pdserve check` accepts (pdserve.schema.addresses.cluster_address_problem). The firewall
built from these addresses: tests/nix/test_firewall_nix.py."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from pdserve.schema.hosts import HostSpec
from tests.nix.firewall_cases import HOSTILE, VALID, spellings, verdict
from tests.nix.test_nix import REPO, nix_eval
from tests.nix.test_nix_hosts import nix_json

ADDRESSES = REPO / "nixos-modules" / "addresses.nix"


def nix_problems(values: list[Any]) -> list[Any]:
    return nix_eval(f"map (import {ADDRESSES}).addressProblem {nix_json(values)}")


def test_nix_refuses_each_hostile_address_for_its_reason():
    values = list(HOSTILE.values())
    for name, value, problem in zip(HOSTILE, values, nix_problems(values), strict=True):
        expected = verdict(value)
        assert expected is not None, name  # every hostile case is one the rule refuses
        assert problem is not None and expected in problem["reason"], (name, value, problem)


def test_nix_takes_the_valid_addresses():
    assert nix_problems(VALID) == [None] * len(VALID)
    assert all(verdict(value) is None for value in VALID)


def test_nix_judges_every_spelling_as_the_rule_does():
    """The Nix verdict is the rule's, and a non-canonical address's fix is exactly Python's spelling."""
    values = spellings(seed=37, count=600)
    problems = nix_problems(values)
    wrong = []
    for value, problem in zip(values, problems, strict=True):
        expected = verdict(value)
        if (problem is None) != (expected is None) or (expected is not None and expected not in problem["reason"]):
            wrong.append((value, expected, problem and problem["reason"]))
        elif expected == "canonical" and problem["suggestion"] != str(ipaddress.ip_address(value)):
            wrong.append((value, str(ipaddress.ip_address(value)), problem["suggestion"]))
    assert not wrong, wrong[:10]
    # The corpus reaches every branch, acceptance included.
    reached = {verdict(value) for value in values}
    assert reached >= {None, "canonical", "IPv4-mapped", "not an IP address", "zone ID", "loopback", "wildcard",
                       "multicast", "link-local", "broadcast", "reserved", "site-local"}, reached


def test_nix_refuses_exactly_what_pdserve_check_refuses():
    """The module and `pdserve check` (pdserve.schema.addresses.cluster_address_problem, issue 37 item 2) accept
    exactly the same cluster addresses, and a non-canonical one gets the same canonical spelling as the fix."""
    addresses = pytest.importorskip("pdserve.schema.addresses", reason="the address model (issue 37 item 2) is "
                                    "not in this tree")
    values = [*VALID, *HOSTILE.values(), *spellings(seed=39, count=600)]
    wrong = []
    for value, problem in zip(values, nix_problems(values), strict=True):
        python = addresses.cluster_address_problem(value)
        if (problem is None) != (python is None):
            wrong.append((value, problem and problem["reason"], python))
        elif problem is not None and "canonical" in problem["reason"] and problem["suggestion"] not in python[1]:
            wrong.append((value, problem["suggestion"], python))
    assert not wrong, wrong[:10]


def test_what_nix_accepts_pdserve_check_accepts():
    """The module never takes an address `pdserve check` (HostSpec) refuses. The converse is the address rule
    of issue 37 item 2 in pdserve.schema.hosts; once it is in, the two accept exactly the same addresses."""
    values = [*VALID, *HOSTILE.values(), *spellings(seed=38, count=300)]
    accepted = [value for value, problem in zip(values, nix_problems(values), strict=True) if problem is None]
    assert len(accepted) > len(VALID)
    for value in accepted:
        HostSpec.model_validate({"address": value})
