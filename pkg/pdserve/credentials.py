"""The API key as systemd hands it to a unit: a file in $CREDENTIALS_DIRECTORY (LoadCredential=)."""

from __future__ import annotations

import os
from pathlib import Path

from pdserve.commands import API_KEY_CREDENTIAL


def api_key_from_credentials(environ: dict[str, str] | None = None) -> str | None:
    """The key this unit was given, or None when it was given none."""
    directory = (environ if environ is not None else os.environ).get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    try:
        key = (Path(directory) / API_KEY_CREDENTIAL).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return key or None
