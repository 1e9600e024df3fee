"""GET a JSON endpoint with the per-probe timeout; never raises for network trouble."""

from __future__ import annotations

import httpx

from pdserve.probes.observations import HttpObs


def get(client: httpx.Client, url: str, headers: dict[str, str] | None = None) -> HttpObs:
    try:
        response = client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return HttpObs(url, None, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return HttpObs(url, response.status_code, body)
