"""systemd unit files for a deployment. Pure: a deployment and a toolchain in, unit texts out.

Contract (ARCHITECTURE.md): After= means ready, so every unit gates its start on `pdserve wait-ready`
in ExecStartPost (SGLang and the router never notify systemd); the router Wants= and is After= both
workers (it outlives their restarts) and its ExecStartPre= finds both ready; the fallback Conflicts=
with every PD unit; the API key arrives through LoadCredential=. The sandbox is render.hardening's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.render.argv import Launch, launches
from pdserve.render.hardening import sandbox
from pdserve.render.toolchain import Toolchain
from pdserve.schema import systemd_syntax
from pdserve.schema.boot import wanted_at_boot
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import API_KEY_CREDENTIAL, MISSING_KEY_STAND_IN, ROUTER_START_TIMEOUT_SEC, unit_name
from pdserve.schema.problems import ConfigError, Problem

# wait-ready gives up this much before systemd would kill it, so its own message reaches the journal.
READY_MARGIN_SEC = 10
# The router's ExecStartPre= check that both workers are ready (their own starts have ended by then).
WORKER_GATE_SEC = 5
# A worker's ExecStartPre= taking it out of the routers: smg removes a worker within a second; a router that
# does not answer by then is left alone (the server must start either way).
LEAVE_ROUTERS_SEC = 10

Section = list[tuple[str, str]]


@dataclass(frozen=True)
class Unit:
    name: str  # without ".service"
    text: str

    @property
    def filename(self) -> str:
        return f"{self.name}.service"


def command_line(argv: tuple[str, ...] | list[str]) -> str:
    """A whole ExecStart= value that systemd turns back into exactly `argv`."""
    return systemd_syntax.exec_line(argv)


def environment_line(name: str, value: str, *, specifiers: bool = False) -> str:
    """One Environment= assignment. Values from the deployment are literal (`%` escaped); pdserve's
    own paths may use systemd specifiers such as %S (state directory)."""
    return systemd_syntax.environment_value(name, value, specifiers=specifiers)


def render_ini(sections: list[tuple[str, Section]], header: str) -> str:
    """The unit text. Every line passes systemd_syntax.directive(), so a value that would end the line,
    continue it or exceed systemd's line limit stops rendering instead of becoming another directive."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for title, entries in sections:
        lines.append("")
        lines.append(f"[{title}]")
        lines.extend(systemd_syntax.directive(key, value) for key, value in entries)
    return "\n".join(lines) + "\n"


def _service(name: str) -> str:
    return f"{name}.service"


def _gpus(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def _describe(dep: Deployment, launch: Launch) -> str:
    role = launch.role
    if role == "router":
        return f"pdserve {dep.name}: smg router (PD) on {launch.url}"
    server = dep.server(role)
    numa = f", NUMA node {server.numa_node}" if server.numa_node is not None else ""
    what = "single SGLang server (fallback)" if role == "fallback" else f"SGLang {role} server"
    return f"pdserve {dep.name}: {what} on GPUs {_gpus(server.gpus)}{numa}, {launch.url}"


def _unit_section(dep: Deployment, role: Role, description: str) -> Section:
    pd_units = [_service(unit_name(dep, r)) for r in ("prefill", "decode", "router")]
    fallback = _service(unit_name(dep, "fallback"))
    entries: Section = [
        ("Description", systemd_syntax.text_value(description)),
        ("Wants", "network-online.target"),
    ]
    if role == "router":
        workers = " ".join(pd_units[:2])
        # Wants= pulls both workers in; After= holds the router until both are *ready*, because a
        # worker's start only completes when its wait-ready gate has passed. Not Requires=: systemd
        # restarts a Requires= dependent with the worker, so one crashed prefill took the public port
        # down until it had reloaded, and the prefill's restart queued behind the router's stop job.
        # A worker that failed to start still keeps the router's process from starting: the router's
        # ExecStartPre= gates (WORKER_GATE_SEC) find it not ready.
        entries += [("Wants", workers), ("After", f"network-online.target {workers}")]
    elif role == "decode" and set(dep.worker("prefill").gpus) & set(dep.worker("decode").gpus):
        # allow_shared_gpus: each server sizes its pool from the memory free when it starts, so two that
        # start together both count the other's share as free. After= (ordering only) starts the decode
        # once the prefill is ready, and a later prefill restart still leaves the decode alone.
        entries.append(("After", f"network-online.target {pd_units[0]}"))
    elif role == "fallback":
        # Ordering only, so that a start of one layout waits for the other's stop to finish: systemd orders
        # the stop of a unit before the start of one ordered against it in either direction, and without
        # an ordering runs them at once. smg keeps its port open for 5 s after SIGTERM and then drains, so a
        # fallback started beside the router's stop found the public port taken ("Address already in use",
        # container tier); a worker's GPUs are only free once its process has gone, too.
        entries.append(("After", f"network-online.target {' '.join(pd_units)}"))
    else:
        entries.append(("After", "network-online.target"))
    # The two layouts share GPUs and the public port: starting one stops the other.
    conflicts = " ".join(pd_units) if role == "fallback" else fallback
    entries.append(("Conflicts", conflicts))
    entries += [
        ("StartLimitIntervalSec", str(dep.systemd.start_limit_interval_sec)),
        ("StartLimitBurst", str(dep.systemd.start_limit_burst)),
    ]
    return entries


def _service_section(dep: Deployment, launch: Launch, config_path: str, tools: Toolchain) -> Section:
    start_timeout = ROUTER_START_TIMEOUT_SEC if launch.role == "router" else dep.systemd.start_timeout_sec
    ready = [tools.pdserve, "wait-ready", launch.role, "--config", config_path,
             "--timeout", str(max(start_timeout - READY_MARGIN_SEC, 1))]
    gates: list[list[str]] = []
    credentials: dict[str, str] = {}
    if launch.role in ("prefill", "decode"):
        gates, ready = warm_start(tools, config_path, launch.role, ready)
        credentials = gate_credentials(dep)
        if launch.role == "prefill" and set(dep.worker("prefill").gpus) & set(dep.worker("decode").gpus):
            # The decode starts only once the prefill's start has ended (After=, see _unit_section): waiting
            # for it would hold both until the deadline. The decode's own gate warms the pair instead.
            ready += ["--peer-wait", "0"]
    elif launch.role == "router":
        # By the time this runs (After=) both workers' starts have ended, ready or failed: the gate only
        # confirms, so it is short.
        gates = [[tools.pdserve, "wait-ready", worker, "--config", config_path, "--timeout", str(WORKER_GATE_SEC),
                  "--interval", "0.5"] for worker in ("prefill", "decode")]
    return service_section(dep, launch, tools, start_timeout=start_timeout, gates=gates, ready=ready,
                           gate_credentials=credentials)


def warm_start(tools: Toolchain, config_path: str, role: str, ready: list[str],
               server: list[str] | None = None) -> tuple[list[list[str]], list[str]]:
    """A PD server's start, warm: out of the routers first (ExecStartPre=), and a gate that hands it back
    only once a real KV hand-off went through it (ExecStartPost=), so that no client request pays SGLang's
    first-transfer stall after a start (launch.warm). `server`: ["--server", NAME] on several hosts."""
    leave = [tools.pdserve, "leave-routers", role, *(server or []), "--config", config_path,
             "--timeout", str(LEAVE_ROUTERS_SEC)]
    return [leave], [*ready, "--warm-up"]


def gate_credentials(dep: Deployment) -> dict[str, str]:
    """The credentials a PD server's own gates need: the router's key, when it has one. smg's worker API
    (DELETE and POST /workers, used by leave-routers and the warm-up) refuses a request without it (401),
    and a unit's User= cannot read the root-owned key file itself. The server process can read it too,
    which tells it nothing new: smg forwards the same key to every worker as the Bearer token of each
    request."""
    return {API_KEY_CREDENTIAL: dep.router.api_key_file} if dep.router.api_key_file else {}


def service_section(dep: Deployment, launch: Launch, tools: Toolchain, *, start_timeout: int,
                    gates: list[list[str]], ready: list[str],
                    gate_credentials: dict[str, str] | None = None) -> Section:
    """[Service] of any unit: `gates` run as ExecStartPre=, `ready` as ExecStartPost= (After= means ready).
    `gate_credentials`: loaded for the gates, each with a stand-in (SetCredential=) that systemd passes
    when the file is not on this host, so that a server starts either way; its gate then says what is missing."""
    sd = dep.systemd
    state = f"pdserve/{dep.name}"
    entries: Section = [
        # Type=exec: the unit fails at once if the binary cannot be executed; readiness is ExecStartPost's job.
        ("Type", "exec"),
        ("User", systemd_syntax.name_value(sd.user)),
        ("Group", systemd_syntax.name_value(sd.group)),
    ]
    if sd.supplementary_groups:
        entries.append(("SupplementaryGroups", systemd_syntax.names_value(sd.supplementary_groups)))
    entries += [
        ("StateDirectory", state),
        ("CacheDirectory", state),
        ("WorkingDirectory", f"%S/{state}"),
        # Triton, torch and Hugging Face caches land under HOME and XDG_CACHE_HOME.
        ("Environment", environment_line("HOME", f"%S/{state}", specifiers=True)),
        ("Environment", environment_line("XDG_CACHE_HOME", f"%C/{state}", specifiers=True)),
    ]
    entries += [("Environment", environment_line(k, v)) for k, v in sorted(launch.env.items())]
    loaded = {**(gate_credentials or {}), **launch.credentials}
    entries += [("LoadCredential", systemd_syntax.credential_value(name, path))
                for name, path in sorted(loaded.items())]
    entries += [("SetCredential", systemd_syntax.set_credential_value(name, MISSING_KEY_STAND_IN))
                for name in sorted(set(gate_credentials or {}) - set(launch.credentials))]
    entries += [("ExecStartPre", command_line(gate)) for gate in gates]
    entries += [
        ("ExecStart", command_line(launch.argv)),
        ("ExecStartPost", command_line(ready)),
        ("Restart", "on-failure"),
        ("RestartSec", str(sd.restart_sec)),
        ("TimeoutStartSec", str(start_timeout)),
        ("TimeoutStopSec", str(sd.stop_timeout_sec)),
        # SIGTERM to the main process lets SGLang stop its scheduler processes itself; whatever is
        # left when it exits (or after TimeoutStopSec) gets SIGKILL.
        ("KillMode", "mixed"),
        ("KillSignal", "SIGTERM"),
        ("LimitNOFILE", "1048576"),
        # NIXL/UCX and RDMA register (pin) large host buffers.
        ("LimitMEMLOCK", "infinity"),
    ]
    return entries + sandbox(launch.role)


def unit_header(dep: Deployment) -> str:
    return (
        f"Rendered by pdserve from deployment {dep.name!r}. Do not edit: change the deployment and\n"
        "render again (NixOS: override with systemd.services.<name>.* drop-ins)."
    )


def render_unit(dep: Deployment, launch: Launch, config_path: str, tools: Toolchain) -> Unit:
    header = unit_header(dep)
    sections = [
        ("Unit", _unit_section(dep, launch.role, _describe(dep, launch))),
        ("Service", _service_section(dep, launch, config_path, tools)),
    ]
    sections += install_sections(dep, launch.role)
    return Unit(launch.unit, render_ini(sections, header))


def install_sections(dep: Deployment, role: Role) -> list[tuple[str, Section]]:
    """[Install] only on the units of the declared boot layout (`boot_layout`): `systemctl enable` of
    all four units then links in exactly that layout, and a unit of the other layout has nothing to
    enable (systemd calls it "static"). `pdserve cutover` changes what runs; this decides what boots."""
    if not wanted_at_boot(dep, role):
        return []
    return [("Install", [("WantedBy", systemd_syntax.unit_names_value([dep.systemd.wanted_by]))])]


def render_units(dep: Deployment, tools: Toolchain, config_path: str) -> list[Unit]:
    """All four units, or a ConfigError naming the input that cannot be rendered exactly (the loader
    refuses such deployment values first; the config path and the tool paths come from flags too)."""
    return exactly(config_path, lambda: [render_unit(dep, launch, config_path, tools)
                                         for launch in launches(dep, tools).values()])


def exactly(config_path: str, render: Callable[[], list[Unit]]) -> list[Unit]:
    """`render()`'s units, or one ConfigError: a config path or a value systemd could not carry exactly."""
    problem = systemd_syntax.text_problem(config_path) or systemd_syntax.path_length_problem(config_path)
    if problem:
        raise ConfigError([Problem("--config-path", config_path, problem, systemd_syntax.TEXT_FIX)], "render")
    try:
        return render()
    except systemd_syntax.Unrepresentable as exc:
        # Only reachable with a deployment that bypassed loading (or a pdserve bug): nothing is written.
        unrendered = Problem("(rendering)", None, str(exc), "fix the value named in the message")
        raise ConfigError([unrendered], "render") from None
