"""The boot layout: which of a deployment's units start at boot, and what systemd's answer means.

Declared, not toggled. The deployment's `boot_layout` decides which units are WantedBy= the boot
target: the renderer writes it into [Install], the NixOS module into `wantedBy`. `pdserve cutover`
changes what runs now; where the boot links can be changed too it changes them, and either way it
names the line that makes the declaration say what should boot, because the next render (or, on
NixOS, the next rebuild) follows the declaration, not the links.
"""

from __future__ import annotations

from typing import Literal

from pdserve.schema.config import Deployment, Role

Layout = Literal["pd", "single"]

BOOT_ROLES: dict[Layout, tuple[Role, ...]] = {"pd": ("prefill", "decode", "router"), "single": ("fallback",)}

def wanted_at_boot(dep: Deployment, role: Role) -> bool:
    return role in BOOT_ROLES[dep.boot_layout]


def nixos_line(dep: Deployment, layout: Layout) -> str:
    """The NixOS option line; <name> is the attribute under services.pdserve.deployments, which the
    module's examples (and hosts/gpu-host) set to settings.name."""
    return f'services.pdserve.deployments.{dep.name}.settings.boot_layout = "{layout}";'


def file_line(layout: Layout, source: str) -> str:
    """The key in the deployment file, spelled the way that file's format spells it."""
    return f'"boot_layout": "{layout}"' if source.lower().endswith(".json") else f'boot_layout = "{layout}"'
