"""`--compare`: the same workload on each layout, switched by the cutover, and always back to the layout
that served when the run started: after the last layout, after a failed cutover, after Ctrl-C.

The order is the serving layout first, then the others: one cutover there and one back, whatever order the
user named. The switching and the measuring are passed in (the command passes the real cutover and
client; the unit tests pass fakes that fail on cue), so the order and the way back are tested apart from
any host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from pdserve.bench.sweep import Sweep
from pdserve.schema.boot import Layout

LAYOUTS: tuple[Layout, ...] = ("pd", "single")


@dataclass(frozen=True)
class Switched:
    """What one cutover did: `ok` when `target` serves and passed its smoke test; else what serves now
    (the cutover's rollback restores the layout it found; None when even that failed) and why."""

    target: Layout
    ok: bool
    serving: Layout | None
    detail: str = ""


@dataclass
class Compared:
    start: Layout
    sweeps: list[Sweep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    failed_layout: Layout | None = None  # a layout whose cutover (smoke test included) failed
    restored: bool = True  # the start layout serves again at the end

    @property
    def complete(self) -> bool:
        return (not self.interrupted and self.failed_layout is None and self.restored
                and all(s.complete for s in self.sweeps))


def parse_layouts(text: str) -> tuple[tuple[Layout, ...], str | None]:
    """"single,pd" as layouts, or why not (an unknown name, one named twice, fewer than two)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        return (), f"{unknown[0]!r} is no layout; name two of: {', '.join(LAYOUTS)} (e.g. single,pd)"
    if len(set(names)) != len(names) or len(names) < 2:
        return (), "name each layout once, both of them: single,pd"
    return tuple(cast(Layout, name) for name in names), None


def order(layouts: Sequence[Layout], start: Layout) -> list[Layout]:
    return sorted(layouts, key=lambda layout: layout != start)


def compare(layouts: Sequence[Layout], start: Layout, switch: Callable[[Layout], Switched],
            measure: Callable[[Layout], Sweep]) -> Compared:
    """Measure each layout in turn; restore `start` before returning, whatever happened."""
    done = Compared(start)
    serving: Layout | None = start
    try:
        for layout in order(layouts, start):
            if layout != serving:
                switched = switch(layout)
                serving = (switched.ok and layout) or switched.serving
                if not switched.ok:
                    done.failed_layout = layout
                    back = (f"the cutover restored {switched.serving}" if switched.serving
                            else "the cutover's rollback failed too")
                    done.notes.append(f"the cutover to {layout} failed ({switched.detail}); {back}; "
                                      f"the comparison ends here, {layout} unmeasured")
                    break
            sweep = measure(layout)
            done.sweeps.append(sweep)
            if sweep.interrupted:
                done.interrupted = True
                break
    except KeyboardInterrupt:
        done.interrupted = True
        done.notes.append("interrupted: what was measured before is kept")
    finally:
        if serving != start:
            switched = switch(start)
            done.restored = switched.ok
            done.notes.append(f"restored {start}, the layout that served at the start" if switched.ok else
                              f"could not restore {start} ({switched.detail}): {switched.serving or 'nothing'} "
                              f"serves now; run `pdserve cutover {start}`")
    return done
