"""Draw pdserve's Grafana dashboard as a PNG from the data of a live test run (not a Grafana screenshot:
Grafana is not packaged in Debian 12, so it cannot run on the test machines).

    PDSERVE_DASHBOARD_DATA=/tmp/dashboard.json PDSERVE_DASHBOARD_SECONDS=90 \\
        .venv/bin/pytest tests/integration/test_prometheus_live.py -k panel_query
    python tests/integration/prometheus_dashboard_png.py /tmp/dashboard.json \
        tests/integration/test_prometheus_dashboard.png

The JSON holds every panel's queries from the rendered dashboard.json, run as range queries against the
test's Prometheus (the real router, smg, and the stand-in workers, `$__rate_interval` = 1m); the layout
is the dashboard's gridPos. Needs matplotlib (a developer tool; CI does not draw the picture).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

UNITS = {"s": "seconds", "ms": "milliseconds", "percentunit": "fraction", "reqps": "requests/s",
         "decgbytes": "GB", "none": ""}


def draw(data: dict, out: Path) -> None:
    panels = data["panels"]
    rows = max(p["gridPos"]["y"] // 8 for p in panels) + 1
    fig, axes = plt.subplots(rows, 3, figsize=(18, 4.2 * rows), squeeze=False)
    fig.patch.set_facecolor("#111217")
    for ax in axes.flat:
        ax.set_visible(False)
    for panel in panels:
        ax = axes[panel["gridPos"]["y"] // 8][panel["gridPos"]["x"] // 8]
        ax.set_visible(True)
        ax.set_facecolor("#181b1f")
        for series in panel["series"]:
            xs = [t for t, _ in series["points"]]
            ys = [v for _, v in series["points"]]
            ax.plot(xs, ys, linewidth=1.4, label=series["legend"])
        ax.set_title(panel["title"], color="#d8d9da", fontsize=11, loc="left")
        ax.set_ylabel(UNITS.get(panel["unit"], panel["unit"]), color="#9fa7b3", fontsize=8)
        ax.set_xlabel("seconds into the run", color="#9fa7b3", fontsize=8)
        ax.tick_params(colors="#9fa7b3", labelsize=7)
        ax.grid(color="#2c3235", linewidth=0.6)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        if panel["series"]:
            ax.legend(fontsize=7, facecolor="#181b1f", edgecolor="#2c3235", labelcolor="#d8d9da", loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", color="#9fa7b3", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{data['title']} (drawn from the dashboard's queries against a live Prometheus, "
                 f"{data['date']}, {data['seconds']:.0f} s of traffic)", color="#d8d9da", fontsize=13)
    fig.text(0.5, 0.005, "real smg 1.13.0 router + pdserve's stand-in SGLang workers (test fixtures: their "
             "values are the stand-in's own, not a model's); Prometheus 2.42 (Debian 12); "
             "tests/integration/prometheus_dashboard_png.py", color="#9fa7b3", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.96))
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} DATA.json OUT.png")
    draw(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
