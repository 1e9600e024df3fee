"""The GPU tier: real SGLang servers on real GPUs, skipped with a reason where either is missing.

PDSERVE_REQUIRE_GPU_SGLANG=1 turns a missing prerequisite into a failure (for runs on a GPU machine
that must not silently skip). PDSERVE_GPU_REPORT names a JSON file the run's measurements go to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdserve.render.toolchain import Toolchain
from tests.conftest import require_or_skip
from tests.fixtures.ports import free_ports
from tests.gpu.pd_run import PDRun, numactl_path, pdserve_executable, write_api_key, write_deployment
from tests.gpu.tiny_model import make_tiny_model

REQUIRE = "PDSERVE_REQUIRE_GPU_SGLANG"


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _node0_exists() -> bool:
    return Path("/sys/devices/system/node/node0").exists()


@pytest.fixture(scope="session")
def report() -> dict:
    """Measurements of this run, written to $PDSERVE_GPU_REPORT at the end (for the docs)."""
    data: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "commit": os.environ.get("PDSERVE_COMMIT", "unknown")}
    yield data
    target = os.environ.get("PDSERVE_GPU_REPORT")
    if target:
        Path(target).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


@pytest.fixture(scope="session")
def pd(tmp_path_factory, report) -> PDRun:
    have_sglang = all(importlib.util.find_spec(m) is not None for m in ("sglang", "smg"))
    require_or_skip(have_sglang, "SGLang and smg (the router) are not installed in this Python", REQUIRE)
    gpus = gpu_count()
    require_or_skip(gpus >= 1, "needs an NVIDIA GPU; found none", REQUIRE)
    workdir = tmp_path_factory.mktemp("gpu-pd")
    model = make_tiny_model(workdir / "tiny-llama")
    numactl = numactl_path()
    numa_node = 0 if numactl and _node0_exists() else None
    ports = dict(zip(("prefill", "decode", "router", "bootstrap", "prometheus"), free_ports(5), strict=True))
    # Two GPUs: prefill and decode on their own; one: both on GPU 0 (allow_shared_gpus). The router
    # always has an API key, delivered as the units deliver it.
    layout = 2 if gpus >= 2 else 1
    config = write_deployment(workdir, model, ports, numa_node=numa_node, gpus=layout,
                              api_key_file=write_api_key(workdir))
    tools = Toolchain(sglang_python=sys.executable, numactl=numactl or "/usr/bin/numactl",
                      pdserve=pdserve_executable(workdir))
    run = PDRun(config, workdir, tools)
    report["deployment"] = config.read_text()
    report["argv"] = {role: list(launch.argv) for role, launch in run.launch.items() if role != "fallback"}
    report["numa_node"] = numa_node
    report["gpus"] = {"visible": gpus, "used": layout, "prefill_and_decode_share_gpu_0": layout == 1}
    try:
        run.up()
        report["ready_after_s"] = {role: round(s, 1) for role, s in run.ready_after.items()}
        yield run
    finally:
        run.stop()
        report["logs_tail"] = {role: run.tail(role, 25) for role in ("prefill", "decode", "router")}


@pytest.fixture
def hf_config_alias():
    """SGLang's alias of transformers' DeepseekV3Config for a model_type (deepseek_v32, deepseek_v4: as
    sglang/srt/utils/hf_transformers/common.py registers them), where the Hugging Face libraries are importable
    (not in the CI venv: its tokenizers and huggingface_hub are newer than transformers 5.12.1 accepts; the
    device run reads the model back with them: the model writers' --check)."""
    have = all(importlib.util.find_spec(m) is not None for m in ("safetensors", "transformers"))
    require_or_skip(have, "safetensors and transformers are not installed here (the device run checks with them: "
                    "the model writer's --check)", "PDSERVE_REQUIRE_HF_LIBS")
    from transformers import DeepseekV3Config

    return lambda model_type: type(f"Alias_{model_type}", (DeepseekV3Config,), {"model_type": model_type})
