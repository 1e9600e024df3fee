"""The boot layout: which of a deployment's units start at boot, and what systemd's answer means.

Declared, not toggled. The deployment's `boot_layout` decides which units are WantedBy= the boot
target: the renderer writes it into [Install], the NixOS module into `wantedBy`. `pdserve cutover`
changes what runs now; where the boot links can be changed too it changes them, and either way it
names the line that makes the declaration say what should boot, because the next render (or, on
NixOS, the next rebuild) follows the declaration, not the links.
"""

from __future__ import annotations

from typing import Literal

from pdserve.config import Deployment, Role

Layout = Literal["pd", "single"]

BOOT_ROLES: dict[Layout, tuple[Role, ...]] = {"pd": ("prefill", "decode", "router"), "single": ("fallback",)}

# UnitFileState (`systemctl is-enabled`) values that mean "pulled in at boot": systemctl(1) says these
# two are "enabled via .wants/, .requires/ or Alias= symlinks", persistently (/etc) or for this boot
# (/run). A NixOS unit whose wantedBy names the target reads "enabled" too: its .wants/ link sits in
# /etc/systemd/system, only that directory lives in the store (the NixOS-shaped container tier sees
# "enabled" for the wanted PD units and "linked" for the fallback that nothing wants). Left out on
# purpose, with systemd's reasons:
# - linked, linked-runtime: the unit file is only made reachable by a symlink (a NixOS unit that nothing
#   wants); is-enabled exits non-zero for them. cutover used to count them as enabled.
# - alias: the queried name is an alias; it says nothing about whether the unit it names starts.
# - static, indirect: no [Install] rules (static) or only Also= (indirect): nothing links the unit in.
# - generated, transient: made by a generator or through the runtime API; "may not be enabled", their
#   maker decides. pdserve never generates its units, so for its units these mean "not ours to enable".
# - masked, masked-runtime, disabled, bad, not-found: not started.
# `systemctl is-enabled` also exits 0 for static, indirect, generated and transient: its exit status
# answers "is there anything to enable", not "does it start at boot", which is the question here.
ENABLED_STATES = frozenset({"enabled", "enabled-runtime"})


def is_enabled(unit_file_state: str) -> bool:
    """True when systemd says the unit starts at boot (see ENABLED_STATES for why only these two)."""
    return unit_file_state in ENABLED_STATES


def wanted_at_boot(dep: Deployment, role: Role) -> bool:
    return role in BOOT_ROLES[dep.boot_layout]


def nixos_line(dep: Deployment, layout: Layout) -> str:
    """The NixOS option line; <name> is the attribute under services.pdserve.deployments, which the
    module's examples (and hosts/gpu-host) set to settings.name."""
    return f'services.pdserve.deployments.{dep.name}.settings.boot_layout = "{layout}";'


def file_line(layout: Layout, source: str) -> str:
    """The key in the deployment file, spelled the way that file's format spells it."""
    return f'"boot_layout": "{layout}"' if source.lower().endswith(".json") else f'boot_layout = "{layout}"'
