"""The kernel's CPU/node list format ("0-3,8-11"), as in /proc/<pid>/status and /sys/devices/system/node."""

from __future__ import annotations


def parse_list(text: str) -> frozenset[int]:
    """"0-3,8-11" -> {0, 1, 2, 3, 8, 9, 10, 11}."""
    result: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        result.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(result)


def ranges(cpus: frozenset[int] | set[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5"."""
    out: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set, and set with it
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
