"""What a cutover touches, read off the placement: the units of each layout on one host, their GPUs, the
public address, the deadlines, that host's smoke test; and the steps a dry run lists for it. Pure: no host
is read here. A single-host file is a one-host deployment; a multi-host one is cut over one host at a time,
in the order pdserve.cutover.order gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.probes.systemctl import service
from pdserve.schema.boot import Layout, nixos_line
from pdserve.schema.config import Deployment
from pdserve.schema.derived import ROUTER_START_TIMEOUT_SEC, url_of
from pdserve.schema.placement import IMPLIED_HOST, Placement, place
from pdserve.schema.topology import host_address, router_hosts
from pdserve.verify.expect import expectations

LAYOUTS: tuple[Layout, ...] = ("pd", "single")

# Our own deadlines sit above systemd's, so systemd's verdict (with its Result) normally arrives first.
DEADLINE_MARGIN_SEC = 15


@dataclass(frozen=True)
class Plan:
    """What a cutover to `target` touches, read off the deployment. Unit names end in .service."""

    deployment: str
    target: Layout
    workers: dict[Layout, tuple[str, ...]]  # started first, in one call (workers_in_turn: systemd orders them)
    fronts: dict[Layout, tuple[str, ...]]  # started once the workers are ready (the router)
    gpus: dict[Layout, tuple[int, ...]]
    public_url: dict[Layout, str]
    worker_deadline: float
    front_deadline: float
    stop_deadline: float
    warnings: tuple[str, ...] = ()
    declared: Layout = "pd"  # the deployment's boot_layout
    wanted_by: str = "multi-user.target"
    source: str = "the deployment file"  # where the deployment was loaded from
    nixos_change: str = ""  # the NixOS option line that declares `target` as the boot layout
    workers_in_turn: bool = False  # prefill and decode share GPUs: the decode unit is After= the prefill
    host: str = ""  # the host whose units these are; "" (IMPLIED_HOST) for a single-host file's one host
    smoke_checks: tuple[str, ...] = ()  # that host's smoke test: verify check ids run from it

    def units(self, layout: Layout) -> tuple[str, ...]:
        return self.workers[layout] + self.fronts[layout]

    @property
    def all_units(self) -> tuple[str, ...]:
        return self.units("pd") + self.units("single")

    @property
    def other(self) -> Layout:
        return "single" if self.target == "pd" else "pd"


def plan_common(dep: Deployment, target: Layout, warnings: Sequence[str], source: str) -> dict:
    """The fields of a Plan that every host's cutover shares."""
    return dict(front_deadline=ROUTER_START_TIMEOUT_SEC + DEADLINE_MARGIN_SEC,
                stop_deadline=dep.systemd.stop_timeout_sec + DEADLINE_MARGIN_SEC, warnings=tuple(warnings),
                declared=dep.boot_layout, wanted_by=dep.systemd.wanted_by, source=source,
                nixos_change=nixos_line(dep, target))


def _sharing(placement: Placement, host: str) -> bool:
    """Whether a decode on `host` shares GPUs with a prefill there (allow_shared_gpus): the rendered decode
    unit is then ordered After= the prefill (pdserve.render.units), so it is ready up to two start timeouts
    after both were started."""
    here = placement.on(host)
    return any(set(p.gpus) & set(d.gpus) for p in here if p.role == "prefill" for d in here if d.role == "decode")


def plan_for(dep: Deployment, target: Layout, warnings: Sequence[str] = (), source: str = "the deployment file",
             host: str = IMPLIED_HOST) -> Plan:
    """The cutover of `host`'s units (a single-host file: its one, implied host; a multi-host file: one host's
    servers, then its router if it runs one, and no other host's unit: there is no fallback)."""
    placement = place(dep)
    here = placement.on(host)

    def units(*roles: str) -> tuple[str, ...]:
        return tuple(service(p.unit) for p in here if p.role in roles)

    def gpus(*roles: str) -> tuple[int, ...]:
        return tuple(sorted({gpu for p in here if p.role in roles for gpu in p.gpus}))

    address = host_address(dep, host) if dep.router.host in {"0.0.0.0", "::"} else None
    url = url_of(address or dep.router.host, dep.router.port)
    fallback = next((p.url for p in here if p.role == "fallback"), url)
    in_turn = _sharing(placement, host)
    return Plan(
        deployment=dep.name,
        target=target,
        workers={"pd": units("prefill", "decode"), "single": units("fallback")},
        fronts={"pd": units("router"), "single": ()},
        gpus={"pd": gpus("prefill", "decode"), "single": gpus("fallback")},
        public_url={"pd": url, "single": fallback},
        worker_deadline=(2 if in_turn else 1) * dep.systemd.start_timeout_sec + DEADLINE_MARGIN_SEC,
        **plan_common(dep, target, warnings, source),
        workers_in_turn=in_turn,
        host=host,
        smoke_checks=smoke_checks(dep, host) if host != IMPLIED_HOST else (),
    )


# The smoke test through a router (pdserve.cutover.host.PD_SMOKE_CHECKS on one host).
ROUTER_SMOKE = ("router.readiness", "router.workers", "e2e.chat")


def smoke_checks(dep: Deployment, host: str) -> tuple[str, ...]:
    """One host's smoke test: through its router where it runs one; else each of its servers answers
    /server_info with its configured args (a node that serves no HTTP of its own: its unit is active)."""
    routers = router_hosts(dep)
    if host in routers:
        # With several routers the verifier names each by host; this step checks its own (the others may
        # not run yet), and e2e.chat goes through it.
        return ROUTER_SMOKE if len(routers) == 1 else (f"router.readiness.{host}", f"router.workers.{host}", "e2e.chat")
    mine = expectations(dep, here=host).on(host)
    return tuple(f"server.{key}" if w.serves_http else f"units.{key}" for key, w in mine.items())


def layout_of(running: Sequence[str], plan: Plan) -> str:
    """Which layouts `running` holds units of: pd, single, pd+single or none."""
    layouts = [lay for lay in LAYOUTS if any(u in running for u in plan.units(lay))]
    return "+".join(layouts) if layouts else "none"


def preview(plan: Plan, running: Sequence[str] | None, serving: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(step, what it would do) for a dry run. `running` None: which units run could not be read, and
    the steps that depend on it say "state unknown" instead of guessing "nothing"."""
    t = plan.target
    known = running is not None
    stop = [u for u in plan.all_units if u in (running or ())]
    restore = [u for u in plan.all_units if u in serving]
    workers = plan.workers[t]
    if t == "pd" and plan.workers_in_turn:
        how = f"prefill, then decode (they share GPUs): {workers[0]} then {workers[1]}"
    else:
        how = f"{', '.join(workers)} in parallel"
    if known:
        holders = ", ".join(stop) or "nothing"
        stopping = ", ".join(stop) or "nothing running"
        bring_back = ", ".join(restore) or "nothing"
    else:
        holders = "the layout being replaced (which units run: state unknown)"
        stopping = f"state unknown: whichever of {', '.join(plan.all_units)} runs"
        bring_back = "what ran before (state unknown)"
    steps = [
        ("preflight: units installed", ", ".join(plan.all_units)),
        ("preflight: target GPUs free", f"checks that GPUs {list(plan.gpus[t])} are free or held by {holders}"),
        ("stop current layout", stopping),
        (f"start {'workers' if t == 'pd' else 'fallback'}", f"{how}, until active (<= {plan.worker_deadline:g} s)"),
    ]
    if plan.fronts[t]:
        steps.append(("start router", f"{', '.join(plan.fronts[t])} (<= {plan.front_deadline:g} s)"))
    if plan.smoke_checks:
        smoke = f"pdserve verify --host {plan.host} --only {','.join(plan.smoke_checks)}"
    elif t == "pd":
        smoke = f"pdserve verify --only router.readiness,router.workers,e2e.chat through {plan.public_url[t]}"
    else:
        smoke = f"chat completion through {plan.public_url[t]}"
    others = plan.units(plan.other)
    steps += [
        ("smoke test", smoke),
        ("enable at boot", f"link {', '.join(plan.units(t))} into {plan.wanted_by}"
                           + (f"; disable {', '.join(others)}" if others else "")
                           + "; where the unit directory is read-only (NixOS) leave it and name the boot_layout line "
                           f"(declared now: {plan.declared})"),
        ("on failure: roll back", f"stop {', '.join(plan.units(t))}; start {bring_back}; smoke test"),
    ]
    return steps
