"""What the sparse MLA timeline probes (probe_timeline.py, probe_first_timeline.py) share: their command line, and
reading the per-CTA clock64 / globaltimer stamps their tuning-build kernels write. Stamps are [reps, ctas, words]
(int64 read as double); a phase is the cycles between two slots of one CTA, turned into microseconds by that CTA's
own clock rate, since the SMs' clocks are not in step."""

from __future__ import annotations

import argparse
import pathlib
import statistics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def timeline_args(description: str, shapes: str, reps: int) -> argparse.ArgumentParser:
    """The options both probes take (the tuning fatbin, shapes, reps, the main cache's size, --json); each adds
    its own."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fatbin", default=str(ROOT / "build" / "sparse_mla_decode_tuning.fatbin"))
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--pool-entries", type=int, default=1 << 20,
                    help="entries in the main KV cache the indices draw from (the benchmark's 2^20 by default; fewer "
                         "spread the gathered records over fewer pages)")
    ap.add_argument("--json", default=None)
    return ap


def clock_ghz(stamps, cycles_from: int, cycles_to: int, ns_from: int, ns_to: int):
    """Each CTA's clock rate in cycles per ns, [reps, ctas]: its clock64 over its globaltimer between two pairs of
    readings (the timer's span clamped to 1 ns, so a CTA too quick for its resolution reads finite)."""
    return ((stamps[..., cycles_to] - stamps[..., cycles_from])
            / (stamps[..., ns_to] - stamps[..., ns_from]).clamp(min=1))


def median_and_slowest_us(cycles, ghz) -> tuple[float, float]:
    """Cycles per CTA, [reps, ctas], in microseconds at each CTA's clock: the median over reps of the median CTA,
    and of the slowest."""
    us = cycles / ghz / 1e3
    return statistics.median(us.median(1).values.tolist()), statistics.median(us.amax(1).tolist())


def phases_us(stamps, phases, ghz) -> dict[str, tuple[float, float]]:
    """(label, from slot, to slot) per phase -> median_and_slowest_us of the cycles between the two slots."""
    return {label: median_and_slowest_us(stamps[..., b] - stamps[..., a], ghz) for label, a, b in phases}
