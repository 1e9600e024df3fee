"""Where the GPU tier's units must differ from what `pdserve render` writes: drop-ins, each saying why.

The rendered unit files are installed unchanged. A drop-in is added only for a fact of the GPU machine that
a real host would not have, decided from facts read there (`needed`), and written through the same systemd
emitter as the units (pdserve.render.units.render_ini), so a value it cannot carry stops the run. What a real
host would need too is a finding for pdserve, fixed there, not here: the SGLang env's bin directory on the
servers' PATH (FlashInfer's `ninja`), a drop-in of the first run on the H100 (2026-12-05), is rendered now.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from pdserve.render.units import environment_line, render_ini

GPU_ROLES = ("prefill", "decode")


def gpu_units(deployment: str) -> list[str]:
    """The units that run SGLang on the GPU: the PD pair and the single-server fallback (`sglang-NAME`, which
    `pdserve cutover` and `pdserve bench --compare` start: the bench run of 2026-12-05 found it without the
    staged site, "No module named 'sglang'")."""
    return [*(f"sglang-{deployment}-{role}.service" for role in GPU_ROLES), f"sglang-{deployment}.service"]


@dataclass(frozen=True)
class DropIn:
    unit: str  # e.g. sglang-gputest-prefill.service
    name: str  # file name under <unit>.d/
    why: str
    entries: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        return f"{self.unit}.d/{self.name}"

    def text(self) -> str:
        header = textwrap.fill(f"GPU tier (tests/gpu/systemd): {self.why}", width=100)
        return render_ini([("Service", list(self.entries))], header)


@dataclass(frozen=True)
class MachineFacts:
    """What decides the drop-ins, read on the GPU machine."""

    device_modes: dict[str, tuple[int, int]]  # node -> (mode bits, group id)
    libcuda_link_dir: str | None  # a directory with libcuda.so (what `cc -lcuda` links), if the driver has one
    libcuda_shim_dir: str  # where the runner puts a libcuda.so link when the driver has none
    staged_site: str | None = None  # SGLang and the routers, staged beside the machine's Python


def needed(deployment: str, facts: MachineFacts) -> list[DropIn]:
    units = gpu_units(deployment)
    dropins: list[DropIn] = []
    if facts.staged_site:
        why = ("the SGLang Python here is the machine's own Python (torch) with SGLang and smg staged in another "
               "directory; a host's SGLang environment has them installed, so its units need no PYTHONPATH")
        entry = ("Environment", environment_line("PYTHONPATH", facts.staged_site))
        dropins += [DropIn(unit, "50-staged-site.conf", why, (entry,))
                    for unit in (*units, f"sglang-{deployment}-router.service")]
    closed = {node: gid for node, (mode, gid) in facts.device_modes.items() if mode & 0o006 != 0o006}
    if closed:
        groups = " ".join(str(gid) for gid in sorted(set(closed.values())))
        why = (f"the machine's device nodes {sorted(closed)} are not open to every user; a host's driver "
               "package makes them 0666 (or adds the service user to their group), so the units get that group")
        dropins += [DropIn(u, "50-device-group.conf", why, (("SupplementaryGroups", groups),)) for u in units]
    if facts.libcuda_link_dir is None:
        why = ("the machine's driver directory has libcuda.so.1 but no libcuda.so, which Triton links its launcher "
               "against (`-lcuda`); a host's driver package ships the link. The runner made one in "
               f"{facts.libcuda_shim_dir}")
        entry = ("Environment", environment_line("TRITON_LIBCUDA_PATH", facts.libcuda_shim_dir))
        dropins += [DropIn(u, "50-triton-libcuda.conf", why, (entry,)) for u in units]
    return dropins


def install(dropins: list[DropIn], unit_dir: Path) -> list[Path]:
    written = []
    for dropin in dropins:
        path = unit_dir / dropin.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dropin.text(), encoding="utf-8")
        written.append(path)
    return written
