"""A NixOS-shaped unit layout for the test container, built once, before it boots.

On NixOS the unit files live in the read-only Nix store and /etc/systemd/system is a link to a store
directory (`...-system-units`) holding a link per unit and the `.wants/` links that `wantedBy` asks
for; only `nixos-rebuild switch` makes a new one. Here the "build" renders the units with the real
`pdserve render` (as the module's renderedUnits derivation does), puts them in a store package, writes
a system-units directory with a link per unit and the `.wants/` links the rendered [Install] sections
ask for (the module derives wantedBy from settings.boot_layout the same way), and points the rootfs's
/etc/systemd/system at it. The container mounts the store read-only at /nix/store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.systemd.container import ContainerError, PythonEnv

STORE = "/nix/store"
UNIT_DIR = "etc/systemd/system"


@dataclass(frozen=True)
class StoreBuild:
    config: str  # the deployment JSON the units read, in the store (what `pdserve cutover -c` takes)
    system_units: str  # the store directory /etc/systemd/system links to
    wanted: dict[str, tuple[str, ...]]  # boot target -> the units linked into its .wants/


def install_targets(unit_text: str) -> list[str]:
    """The WantedBy= targets of a unit file's [Install] section."""
    section, targets = "", []
    for line in unit_text.splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[Install]" and line.startswith("WantedBy="):
            targets += line.split("=", 1)[1].split()
    return targets


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _copy_tree_as_links(source: Path, target: Path) -> None:
    """The distribution's own /etc/systemd/system, carried into the store directory unchanged:
    directories, links (aliases, .wants/ entries, masks) and plain files."""
    for entry in sorted(source.rglob("*")):
        dest = target / entry.relative_to(source)
        if entry.is_symlink():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(entry), dest)
        elif entry.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry, dest)


def _read_only(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o555 if path.is_dir() else 0o444)


def build(root: Path, store: Path, data: dict[str, Any], env: PythonEnv, work: Path) -> StoreBuild:
    """Render `data` into `store` (mounted at /nix/store inside) and make `root`'s /etc/systemd/system
    the store's system-units directory. Run before the container boots."""
    name = data["name"]
    source = work / f"{name}.json"
    source.write_text(json.dumps(data))
    package = f"{_digest('units', source.read_text())}-pdserve-{name}-units"
    config = f"{STORE}/{package}/share/pdserve/pdserve-{name}.json"
    staging = work / "render"
    shutil.rmtree(staging, ignore_errors=True)
    argv = [env.executable("pdserve"), "render", "-c", str(source), "--out", str(staging), "--config-path", config,
            "--sglang-python", env.python, "--numactl", "/usr/bin/numactl", "--pdserve", env.executable("pdserve")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ContainerError(f"pdserve render failed: {done.stderr}")

    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    store.chmod(0o755)
    units_dir = store / package / "lib/systemd/system"
    units_dir.mkdir(parents=True)
    (store / package / "share/pdserve").mkdir(parents=True)
    shutil.move(staging / f"pdserve-{name}.json", store / package / "share/pdserve")
    wanted: dict[str, list[str]] = {}
    for unit in sorted(staging.glob("*.service")):
        shutil.move(unit, units_dir / unit.name)
        for target in install_targets((units_dir / unit.name).read_text()):
            wanted.setdefault(target, []).append(unit.name)

    etc_units = root / UNIT_DIR
    system_units = store / f"{_digest('system-units', package)}-system-units"
    _copy_tree_as_links(etc_units, system_units)
    for unit in sorted(units_dir.iterdir()):
        (system_units / unit.name).symlink_to(f"{STORE}/{package}/lib/systemd/system/{unit.name}")
    for target, units in wanted.items():
        wants = system_units / f"{target}.wants"
        wants.mkdir(exist_ok=True)
        for unit in units:
            (wants / unit).symlink_to(f"{STORE}/{package}/lib/systemd/system/{unit}")
    _read_only(store / package)
    _read_only(system_units)

    shutil.rmtree(etc_units)
    etc_units.symlink_to(f"{STORE}/{system_units.name}")
    return StoreBuild(config, f"{STORE}/{system_units.name}", {t: tuple(u) for t, u in wanted.items()})
