"""Bring up a real PD deployment on this machine's GPUs from pdserve's rendered commands, and take it down.

Every process gets exactly the argv and environment `pdserve.render.argv.launches` renders (what the
systemd units run), and the readiness gate between workers and router is `pdserve wait-ready ROLE`,
the units' ExecStartPost=. Processes run in their own sessions so `stop` takes their children too,
and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.render.argv import Launch, launches
from pdserve.render.toolchain import Toolchain
from pdserve.schema.config import Deployment
from pdserve.schema.loading import load
from tests.fixtures.deployment_text import loopback_router
from tests.fixtures.procstat import processes

SERVED_NAME = "tiny"
CONTEXT_LENGTH = 4096
# Flags for a tiny model with dummy weights on Hopper without FA3's library (see wheelhouse.py):
# triton attention and torch sampling are SGLang's own portable backends.
TEST_SERVER_FLAGS = ["--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend", "pytorch"]
READY_TIMEOUT = 600.0
STOP_TIMEOUT = 30.0
# systemd.restart_sec of the test deployment: the wait before a crashed worker is started again. Shorter
# than the reference's 10 s to spend less device time; the measured recovery includes it.
RESTART_SEC = 5


def write_deployment(directory: Path, model_dir: Path, ports: dict[str, int], *, numa_node: int | None,
                     gpus: int = 2, api_key_file: Path | None = None, transfer_backend: str = "nixl",
                     environment: dict[str, str] | None = None) -> Path:
    """A deployment of the tiny model: prefill on GPU 0, decode on GPU 1, router in front.

    With `gpus=1` both servers share GPU 0 (allow_shared_gpus, for a one-GPU machine). A tenth of each
    GPU per server holds 14.5M tokens of this model's KV (measured on an H200), far more than the tests
    use, and leaves the rest of the GPU to whatever else shares the machine. `api_key_file` puts the
    router behind a key, delivered as the units deliver it (LoadCredential= and the keyed launcher);
    `environment` adds to the servers' environment (the systemd tier's PYTHONPATH to the staged site)."""
    if gpus not in (1, 2):
        raise ValueError(f"the test deployment is laid out for 1 or 2 GPUs, not {gpus}")
    numa = f"numa_node = {numa_node}\n" if numa_node is not None else ""
    flags = json.dumps(TEST_SERVER_FLAGS)
    shared = "allow_shared_gpus = true\n" if gpus == 1 else ""
    decode_gpu = 0 if gpus == 1 else 1
    fallback_gpus = [0] if gpus == 1 else [0, 1]
    key = f'api_key_file = "{api_key_file}"\n' if api_key_file is not None else ""
    extra_env = "".join(f"{name} = {json.dumps(value)}\n" for name, value in (environment or {}).items())
    text = f"""name = "gputest"
{shared}
[model]
path = "{model_dir}"
served_name = "{SERVED_NAME}"
context_length = {CONTEXT_LENGTH}

[prefill]
gpus = [0]
{numa}port = {ports['prefill']}
mem_fraction_static = 0.1
extra_args = {flags}

[decode]
gpus = [{decode_gpu}]
{numa}port = {ports['decode']}
mem_fraction_static = 0.1
extra_args = {flags}

{loopback_router(ports, transfer_backend=transfer_backend, health_check_timeout_secs=30,
                worker_startup_timeout_secs=600)}{key}
[environment]
CUDA_DEVICE_ORDER = "PCI_BUS_ID"
UCX_TLS = "cuda_copy,cuda_ipc,tcp"
PYTHONUNBUFFERED = "1"
{extra_env}
[systemd]
restart_sec = {RESTART_SEC}

[fallback]
gpus = {json.dumps(fallback_gpus)}
mem_fraction_static = 0.1
extra_args = {flags}
"""
    path = directory / "deployment.toml"
    path.write_text(text, encoding="utf-8")
    return path


def write_api_key(directory: Path) -> Path:
    """A fresh random key in a 0600 file, as an operator would keep it for LoadCredential=."""
    path = directory / "router-api-key"
    path.touch(mode=0o600)
    path.write_text(secrets.token_urlsafe(24) + "\n", encoding="utf-8")
    return path


def pdserve_executable(directory: Path) -> str:
    """The installed `pdserve` console script, or an equivalent one for this Python (same entry point)."""
    beside = Path(sys.executable).with_name("pdserve")
    if beside.exists():
        return str(beside)
    shim = directory / "pdserve"
    shim.write_text(f"#!{sys.executable}\nfrom pdserve.cli.main import main\nmain()\n", encoding="utf-8")
    shim.chmod(0o755)
    return str(shim)


@dataclass
class PDRun:
    config: Path
    workdir: Path
    tools: Toolchain
    deployment: Deployment = field(init=False)
    launch: dict[str, Launch] = field(init=False)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    ready_after: dict[str, float] = field(default_factory=dict)
    # Added to every process's environment (the CPU tests put the stand-in SGLang on PYTHONPATH with it).
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.deployment = load(self.config).deployment  # raises ConfigError on any error
        self.launch = launches(self.deployment, self.tools)

    def url(self, role: str) -> str:
        return self.launch[role].url

    def log(self, role: str) -> Path:
        return self.workdir / f"{role}.log"

    def start(self, role: str) -> None:
        launch = self.launch[role]
        env = {**os.environ, **self.extra_env, **launch.env}
        if "PATH" in launch.env and os.environ.get("PATH"):
            # The rendered PATH (the SGLang env's bin first) as the unit has it, then this machine's own, where
            # a tool may live that a host keeps in /usr/bin (the GPU machines' nvidia-smi, say).
            env["PATH"] = f"{launch.env['PATH']}:{os.environ['PATH']}"
        if launch.credentials:
            env["CREDENTIALS_DIRECTORY"] = str(self._credentials(role, launch.credentials))
        with open(self.log(role), "ab") as log:
            self.procs[role] = subprocess.Popen(list(launch.argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True)
        self.started[role] = time.monotonic()

    def _credentials(self, role: str, credentials: dict[str, str]) -> Path:
        """What systemd's LoadCredential=NAME:FILE provides: a private directory holding a copy of each file."""
        directory = self.workdir / "credentials" / role
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        for name, source in credentials.items():
            target = directory / name
            target.unlink(missing_ok=True)
            target.touch(mode=0o400)
            target.write_bytes(Path(source).read_bytes())
        return directory

    def gate(self, roles: list[str], timeout: float = READY_TIMEOUT) -> None:
        """Run the units' readiness gate for `roles` at once; record each role's time to ready."""
        gates = {
            role: subprocess.Popen([self.tools.pdserve, "wait-ready", role, "--config", str(self.config),
                                    "--timeout", str(timeout), "--interval", "1"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for role in roles
        }
        # systemd fails a unit whose main process exits during ExecStartPost=; do the same here rather
        # than let the gate wait out its deadline for a server that is already gone.
        deadline = time.monotonic() + timeout + 30
        failures = []
        while gates and time.monotonic() < deadline:
            for role, gate in list(gates.items()):
                server = self.procs[role]
                if gate.poll() is not None:
                    out = gate.stdout.read() if gate.stdout else ""
                    if gate.returncode == 0:
                        self.ready_after[role] = time.monotonic() - self.started[role]
                    else:
                        failures.append(f"{role}: gate exit {gate.returncode}: {out.strip()}")
                    del gates[role]
                elif server.poll() is not None:
                    gate.kill()
                    gate.wait()
                    failures.append(f"{role}: server exited with {server.returncode} before it was ready")
                    del gates[role]
            time.sleep(0.5)
        for role, gate in gates.items():
            gate.kill()
            gate.wait()
            failures.append(f"{role}: gate still waiting after {timeout + 30:.0f} s")
        logs = "".join(f"\n--- {role} log ---\n{self.tail(role)}" for role in roles)
        assert not failures, "\n".join(failures) + logs

    @property
    def shares_gpus(self) -> bool:
        return bool(set(self.deployment.prefill.gpus) & set(self.deployment.decode.gpus))

    def up(self) -> None:
        if self.shares_gpus:
            # Each SGLang server sizes its pool from the GPU memory free when it starts; two that measure
            # before either has allocated would together take more than both fractions. One after the other.
            self.start("prefill")
            self.gate(["prefill"])
            self.start("decode")
            self.gate(["decode"])
        else:
            self.start("prefill")
            self.start("decode")
            self.gate(["prefill", "decode"])
        self.start("router")
        self.gate(["router"], timeout=120)

    def kill_group(self, role: str) -> float:
        """kill -9 the role's whole process group, leader and children at once (a segfault in a scheduler
        is followed by systemd killing the unit's cgroup); return when it was sent, after all are gone."""
        proc = self.procs[role]
        killed_at = time.monotonic()
        _signal_group(proc, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = group_members(proc.pid)
        assert not left, f"{role}: processes {left} of group {proc.pid} survived SIGKILL for {STOP_TIMEOUT:.0f} s"
        return killed_at

    def restart(self, role: str, timeout: float = READY_TIMEOUT) -> float:
        """What systemd does for Restart=on-failure: wait RestartSec, run the same ExecStart= again, then
        the ExecStartPost= gate; return when the gate passed."""
        time.sleep(self.deployment.systemd.restart_sec)
        self.start(role)
        self.gate([role], timeout=timeout)
        return time.monotonic()

    def stop(self) -> None:
        """SIGTERM each process group (router first), SIGKILL what is left after STOP_TIMEOUT."""
        for role in ("router", "decode", "prefill"):
            proc = self.procs.pop(role, None)
            if proc is None:
                continue
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_TIMEOUT)
            # Scheduler and detokenizer children share the group and can outlive a leader that crashed
            # or stopped: none of them may keep holding a GPU.
            _signal_group(proc, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT)

    def tail(self, role: str, lines: int = 60) -> str:
        try:
            return "\n".join(self.log(role).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is `pgid`, read from /proc."""
    return [p.pid for p in processes() if p.pgrp == pgid and p.state != "Z"]


def numactl_path() -> str | None:
    return shutil.which("numactl")
