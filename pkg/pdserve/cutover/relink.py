"""The boot step's writes: link the target layout in and the other one out, where this host allows it.

Whether it may (pdserve.cutover.boot_links.boot_access) is asked first, with systemd's answers and the
unit files' facts; a read-only refusal that shows only when systemctl tries is still "read-only", not a
failure. Never raises: the smoke test has passed, and nothing here may undo the layout that serves.
"""

from __future__ import annotations

from pdserve.cutover.boot_links import boot_access
from pdserve.cutover.edge import Edge
from pdserve.cutover.plan import Plan
from pdserve.probes.systemctl import SystemctlError, UnitState


def try_relink(plan: Plan, edge: Edge) -> tuple[str, str, bool]:
    """(result, detail, nixos): whether and how the boot links changed. Never raises."""
    nixos = False
    try:
        states = edge.show(plan.all_units)
        access = boot_access(states, edge.unit_files(states))
        nixos = access.nixos
        if not access.settable:
            return "read-only", f"boot links left as they are: {access.reason}", nixos
        return (*_relink(plan, edge, states), nixos)
    except OSError as exc:  # reading the unit files' facts
        return "failed", f"could not read the unit files: {exc}", nixos
    except SystemctlError as exc:
        if exc.read_only:
            return "read-only", f"boot links left as they are: {exc}", nixos
        return "failed", f"could not change the boot links: {exc}", nixos
    except KeyboardInterrupt as exc:
        return "failed", f"interrupted ({exc.args[0] if exc.args else 'Ctrl-C'}) while changing the boot links", nixos


def _relink(plan: Plan, edge: Edge, states: dict[str, UnitState]) -> tuple[str, str]:
    """Link the target into the boot target first, then unlink the other layout: a failure half way
    leaves something that starts at boot rather than nothing."""
    link = [u for u in plan.units(plan.target) if not states[u].enabled]
    unlink = [u for u in plan.units(plan.other) if states[u].enabled]
    if link:
        edge.add_wants(plan.wanted_by, link)
    if unlink:
        edge.disable(unlink)
    if not link and not unlink:
        return "unchanged", f"{plan.target} already starts at boot and {plan.other} does not"
    done = [f"linked {', '.join(link)} into {plan.wanted_by}"] if link else []
    done += [f"disabled {', '.join(unlink)}"] if unlink else []
    return "changed", "; ".join(done)
