"""nixos-modules/from-python.json is what pdserve computes for the NixOS module (pdserve.render.nixos_data):
the committed file must be exactly what pdserve writes now, and the module must fill its slots into what
pdserve's own functions return (tests/nix/test_nix.py and test_nix_hosts.py compare the filled values)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from pdserve.render.nixos_data import nixos_data
from tests.nix.test_nix import REPO

COMMITTED = REPO / "nixos-modules" / "from-python.json"


def test_the_committed_file_is_what_pdserve_writes_now() -> None:
    written = subprocess.run([sys.executable, "-m", "pdserve.render.nixos_data"], capture_output=True, text=True,
                             timeout=60, check=True, cwd=REPO).stdout
    assert json.loads(COMMITTED.read_text(encoding="utf-8")) == nixos_data()
    assert COMMITTED.read_text(encoding="utf-8") == written, (
        "nixos-modules/from-python.json is stale: "
        "run python -m pdserve.render.nixos_data > nixos-modules/from-python.json")


def test_every_slot_is_one_the_module_fills() -> None:
    """A slot the module does not know would reach a unit name or a scrape job as text."""
    text = COMMITTED.read_text(encoding="utf-8")
    slots = set(re.findall(r"@[a-z]+@", text))
    assert slots == {"@name@", "@server@", "@role@"}
    derived = (REPO / "nixos-modules" / "derived.nix").read_text(encoding="utf-8")
    assert all(f'"{slot}" =' in derived for slot in slots)
