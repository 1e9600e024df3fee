"""What the NixOS module needs of pdserve's computation, as data: nixos-modules/from-python.json.

The module cannot run Python while it evaluates (reading a derivation's output there would be
import-from-derivation), so pdserve writes the names and shapes it computes into a committed file with
`@name@`-style slots, and the module fills them in: the unit names, the Prometheus scrape jobs (name,
path, labels, the timeout's cap) and the port span SGLang binds above --dist-init-addr's port. Each
value comes from calling pdserve's own function on the reference deployment under a slot name, not
from retyping it. tests/nix/test_from_python.py holds the committed file equal to `nixos_data()`;
regenerate it with `python -m pdserve.render.nixos_data > nixos-modules/from-python.json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any, get_args

from pdserve.render.monitoring.scrape import scrape_configs
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import unit_name
from pdserve.schema.loading import default_profile_text, deployment_from_data, parse_document
from pdserve.schema.topology import DIST_INIT_SPAN, Node, server_unit, servers

# The slots the module fills (builtins.replaceStrings): none can be part of a valid name.
NAME = "@name@"
SERVER = "@server@"
ROLE = "@role@"
# An interval far above any cap, so the rendered timeout is the cap itself.
_LONG_INTERVAL_SECS = 10**6


def _reference() -> Deployment:
    text = default_profile_text()
    return deployment_from_data(parse_document(text, "toml", "<profile>"), "<profile>").deployment


def _named(dep: Deployment) -> Deployment:
    # model_copy does not validate, so the slot stands where a name would.
    return dep.model_copy(update={"name": NAME})


def _scrape_job(dep: Deployment) -> dict[str, Any]:
    """The job of one role with its per-deployment values as slots (targets stay the module's: they are
    the deployment's own listen addresses)."""
    slow = dep.model_copy(update={"monitoring": dep.monitoring.model_copy(
        update={"scrape_interval_secs": _LONG_INTERVAL_SECS})})
    first = scrape_configs(slow)[0]
    role = first["static_configs"][0]["labels"]["role"]
    return {
        "job_name": first["job_name"].replace(role, ROLE),
        "metrics_path": first["metrics_path"],
        "labels": {key: value.replace(role, ROLE) for key, value in first["static_configs"][0]["labels"].items()},
        "timeout_cap_secs": int(first["scrape_timeout"].removesuffix("s")),
    }


def nixos_data() -> dict[str, Any]:
    dep = _named(_reference())
    node0 = Node(replace(servers(dep, "prefill")[0], name=SERVER), 0)
    node1 = Node(node0.server, 1)
    return {
        "generated_by": "python -m pdserve.render.nixos_data",
        "unit_names": {role: unit_name(dep, role) for role in get_args(Role)},
        # A server's unit on node 0; each further node adds this suffix and its rank.
        "server_unit": server_unit(dep, node0),
        "node_unit_suffix": server_unit(dep, node1).removeprefix(server_unit(dep, node0)).removesuffix("1"),
        "scraped_roles": [job["static_configs"][0]["labels"]["role"] for job in scrape_configs(dep)],
        "scrape_job": _scrape_job(dep),
        "dist_init_span": DIST_INIT_SPAN,
    }


def main() -> None:
    json.dump(nixos_data(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
