"""The text of a systemd unit: the INI writer, the [Service] every unit shares, [Install]. Pure.

pdserve.render.units decides which units a host runs and how each one orders and gates its start; this
module turns that into the lines systemd reads. Every line passes schema.systemd_syntax, and the sandbox
is render.hardening's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.render.argv import Launch
from pdserve.render.hardening import sandbox
from pdserve.render.toolchain import Toolchain
from pdserve.schema import systemd_syntax
from pdserve.schema.boot import wanted_at_boot
from pdserve.schema.config import Deployment, Role
from pdserve.schema.derived import MISSING_KEY_STAND_IN
from pdserve.schema.problems import ConfigError, Problem

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
        *sigkill_ends(launch.role),
        ("LimitNOFILE", "1048576"),
        # NIXL/UCX and RDMA register (pin) large host buffers.
        ("LimitMEMLOCK", "infinity"),
    ]
    return entries + sandbox(launch.role)


def sigkill_ends(role: Role) -> Section:
    """SGLang 0.5.17 ends every SIGTERM by SIGKILLing its own process tree, itself included, once it has drained
    (its tokenizer manager's sigterm_watchdog: kill_process_tree(os.getpid(), include_parent=True)); 0.5.23 kills only
    its children there, but SGLang's crash paths still end that way. Without these, every planned stop of a worker on
    0.5.17 leaves its unit "failed" (seen on the GPU tier, 2026-12-06), and `pdserve verify` reports the fallback
    failed after every cutover back. So a SIGKILL is a clean end, and still restarts the unit while it runs (kill
    -9, the OOM killer, SGLang ending itself after a crash): RestartForceExitStatus= restarts whatever Restart=
    says, and systemd never restarts a unit it was asked to stop. The router (smg) exits cleanly on SIGTERM."""
    if role == "router":
        return []
    return [("SuccessExitStatus", "SIGKILL"), ("RestartForceExitStatus", "SIGKILL")]


def unit_header(dep: Deployment) -> str:
    return (
        f"Rendered by pdserve from deployment {dep.name!r}. Do not edit: change the deployment and\n"
        "render again (NixOS: override with systemd.services.<name>.* drop-ins)."
    )


def install_sections(dep: Deployment, role: Role) -> list[tuple[str, Section]]:
    """[Install] only on the units of the declared boot layout (`boot_layout`): `systemctl enable` of
    all four units then links in exactly that layout, and a unit of the other layout has nothing to
    enable (systemd calls it "static"). `pdserve cutover` changes what runs; this decides what boots."""
    if not wanted_at_boot(dep, role):
        return []
    return [("Install", [("WantedBy", systemd_syntax.unit_names_value([dep.systemd.wanted_by]))])]


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
