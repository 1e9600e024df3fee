"""One test deployment inside the container: rendered by the real `pdserve render`, served by the
stand-in SGLang workers (behind `python -m sglang.launch_server`) and the real router, smg 1.13.0."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pdserve.schema.config import Deployment
from pdserve.schema.derived import unit_name
from pdserve.schema.loading import deployment_from_data
from pdserve.schema.placement import role_url
from tests.integration.systemd.container import Container, ContainerError, wait_for

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))

from standin_sglang import make_shim  # noqa: E402
from standin_sglang.launch import free_ports  # noqa: E402

NAME = "pdt"
SHIM_DIR = "/opt/pdserve-standin-shim"
CONFIG_PATH = f"/etc/systemd/system/pdserve-{NAME}.json"
KEY_PATH = "/etc/pdserve/router.key"
MODEL = "standin-model"
# Short enough to keep the tier quick, long enough for a 20 s startup delay plus the stand-in's own
# start (importing SGLang's argument parser takes ~5 s on an idle core, more on CI's two busy ones).
START_TIMEOUT_SEC = 45
# For deployments with a worker that is meant never to become ready: the failure comes sooner.
SHORT_START_TIMEOUT_SEC = 30


def base_deployment(ports: dict[str, int], numa_node: int | None) -> dict[str, Any]:
    return {
        "name": NAME,
        "model": {"path": "/var/lib/models/standin", "served_name": MODEL, "reasoning_parser": "deepseek-v4",
                  "tool_call_parser": "deepseekv4", "context_length": 32768},
        "prefill": {"gpus": [0], "numa_node": numa_node, "port": ports["prefill"], "mem_fraction_static": 0.8,
                    "chunked_prefill_size": 4096},
        "decode": {"gpus": [1], "numa_node": numa_node, "port": ports["decode"], "mem_fraction_static": 0.8},
        "transfer": {"backend": "nixl", "bootstrap_port": ports["bootstrap"]},
        "router": {"host": "127.0.0.1", "port": ports["router"], "prometheus_host": "127.0.0.1",
                   "prometheus_port": ports["prometheus"], "health_check_timeout_secs": 10,
                   "worker_startup_timeout_secs": 60, "request_timeout_secs": 60},
        "environment": {"PYTHONPATH": SHIM_DIR, "PYTHONUNBUFFERED": "1", "SGLANG_TIMEOUT_KEEP_ALIVE": "75"},
        "fallback": {"gpus": [0, 1], "mem_fraction_static": 0.8},
        "systemd": {"start_timeout_sec": START_TIMEOUT_SEC, "stop_timeout_sec": 15, "restart_sec": 2,
                    "start_limit_burst": 100, "start_limit_interval_sec": 60},
    }


@dataclass
class Lab:
    container: Container
    work: Path
    ports: dict[str, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    dep: Deployment | None = None

    @classmethod
    def create(cls, container: Container, work: Path) -> Lab:
        lab = cls(container, work)
        names = ("prefill", "decode", "router", "prometheus", "bootstrap")
        lab.ports = dict(zip(names, free_ports(len(names)), strict=True))
        make_shim(container.path(SHIM_DIR))
        return lab

    # -- deployments ------------------------------------------------------------------------------

    def variant(self, *, prefill_env: dict[str, str] | None = None, decode_env: dict[str, str] | None = None,
                fallback_env: dict[str, str] | None = None, api_key: bool = False,
                start_timeout: int = START_TIMEOUT_SEC, boot_layout: str = "pd") -> dict[str, Any]:
        numa = 0 if Path("/sys/devices/system/node/node0").is_dir() else None
        data = copy.deepcopy(base_deployment(self.ports, numa))
        data["systemd"]["start_timeout_sec"] = start_timeout
        data["prefill"]["env"] = prefill_env or {}
        data["decode"]["env"] = decode_env or {}
        data["fallback"]["env"] = fallback_env or {}
        data["boot_layout"] = boot_layout
        if api_key:
            data["router"]["api_key_file"] = KEY_PATH
        return data

    def install(self, data: dict[str, Any]) -> Deployment:
        """Render with the real CLI into the container's /etc/systemd/system and reload systemd."""
        self.dep = deployment_from_data(copy.deepcopy(data), "lab").deployment
        self.data = data
        source = self.work / f"{NAME}.json"
        source.write_text(json.dumps(data))
        env = self.container.env
        argv = [env.executable("pdserve"), "render", "-c", str(source),
                "--out", str(self.container.path("/etc/systemd/system")), "--config-path", CONFIG_PATH,
                "--sglang-python", env.python, "--numactl", "/usr/bin/numactl", "--pdserve", env.executable("pdserve")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ContainerError(f"pdserve render failed: {done.stderr}")
        self.container.run(["systemctl", "daemon-reload"], timeout=60)
        return self.dep

    def write_key(self, key: str) -> None:
        path = self.container.path(KEY_PATH)
        path.write_text(key + "\n")
        path.chmod(0o600)

    def reset(self) -> None:
        """Every unit of the deployment stopped, not failed and disabled: each test starts from here."""
        units = self.units()
        self.container.run(["systemctl", "stop", *units], timeout=120, check=False)
        self.container.run(["systemctl", "reset-failed", *units], timeout=30, check=False)
        self.container.run(["systemctl", "disable", *units], timeout=30, check=False)

    # -- names and views --------------------------------------------------------------------------

    def unit(self, role: str) -> str:
        assert self.dep is not None
        return f"{unit_name(self.dep, role)}.service"  # type: ignore[arg-type]

    def units(self) -> list[str]:
        return [f"sglang-{NAME}-prefill.service", f"sglang-{NAME}-decode.service",
                f"sglang-{NAME}-router.service", f"sglang-{NAME}.service"]

    def url(self, role: str) -> str:
        assert self.dep is not None
        return role_url(self.dep, role)  # type: ignore[arg-type]

    def states(self):
        return self.container.systemctl.show(self.units())

    def active(self) -> set[str]:
        return {n for n, s in self.states().items() if s.active_state == "active"}

    def running(self) -> set[str]:
        return {n for n, s in self.states().items() if s.running}

    def diagnostics(self) -> str:
        parts = [s.describe() for s in self.states().values()]
        for unit in self.units():
            parts.append(f"--- journal of {unit}\n{self.container.journal(unit, 25)}")
        return "\n".join(parts)

    # -- requests from the host (the container shares its network) --------------------------------

    def chat(self, url: str | None = None, key: str | None = None, timeout: float = 30) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        with httpx.Client(timeout=timeout) as client:
            return client.post(f"{url or self.url('router')}/v1/chat/completions", json=body, headers=headers)

    def wait_serving(self, url: str | None = None, key: str | None = None, timeout: float = 60) -> httpx.Response:
        def attempt():
            try:
                response = self.chat(url, key, timeout=10)
            except httpx.HTTPError:
                return None
            return response if response.status_code == 200 else None

        return wait_for(attempt, timeout, f"a 200 chat completion through {url or self.url('router')}", 1.0)  # type: ignore[return-value]

    def pdserve(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run the pdserve CLI inside the container, as root, the way an operator would."""
        began = time.monotonic()
        done = self.container.run([self.container.env.executable("pdserve"), *args], timeout=timeout, check=False)
        done.elapsed = time.monotonic() - began  # type: ignore[attr-defined]
        return done
