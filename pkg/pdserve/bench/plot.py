"""The PNG: latency against throughput across the sweep, one line per layout (the curve people read a
serving benchmark by: how much latency each step of load costs). matplotlib draws it, imported only when
a plot is asked for; `missing()` says, before any request is sent, when it is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from pdserve.bench.sweep import Sweep

PANELS = (("ttft_p50_ms", "ttft_p99_ms", "TTFT (ms)"), ("itl_p50_ms", "itl_p99_ms", "ITL (ms)"),
          ("e2e_p50_ms", "e2e_p99_ms", "end-to-end latency (ms)"))


def missing() -> str | None:
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed where pdserve runs"
    return None


def draw(sweeps: Sequence[Sweep], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the product
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), constrained_layout=True)
    for ax, (p50, p99, label) in zip(axes, PANELS, strict=True):
        for sweep in sweeps:
            points = [r for r in sweep.results if r.measured]
            x = [r.figures["output_tok_s"] for r in points]
            for key, style in ((p50, "-o"), (p99, "--s")):
                ax.plot(x, [r.figures[key] for r in points], style, label=f"{sweep.layout} {key.split('_')[1]}")
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle(title)
    figure.savefig(out, dpi=100)
    plt.close(figure)
