"""A deployment read for rendering: the schema's problems and the render layer's, in one report.

Every adapter (the CLI commands, the NixOS build-time check through `pdserve check`) reads files
through here, so a file that validates but could not be rendered into a loadable unit is refused
with all its other problems, not later by systemd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdserve.render import fit
from pdserve.render.reach import paths_within_reach
from pdserve.schema.loading import Loaded, deployment_from_data, load

# The render layer's rules: what the emitted files must fit (fit), and what the units' sandbox lets them
# reach (reach).
RENDER_RULES = (*fit.RENDER_RULES, paths_within_reach)


def load_renderable(path: Path | None = None) -> Loaded:
    """The deployment at `path` (the embedded reference profile without one), fit to render."""
    return load(path, RENDER_RULES)


def renderable_from_data(data: dict[str, Any], source: str) -> Loaded:
    return deployment_from_data(data, source, RENDER_RULES)
