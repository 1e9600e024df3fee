"""The NVML probe's reading of nvidia-ml-py's answers, with a stand-in `pynvml` module (this machine has
no NVIDIA driver; the GPU tier runs the real one). What the stand-in returns has nvidia-ml-py 13's types:
names and PCI bus ids as bytes (c_char arrays), memory in bytes, processes with a pid."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from pdserve.probes import nvml
from pdserve.probes.observations import GpuObs, Unavailable


class NVMLError(Exception):
    pass


def fake_pynvml(gpus: list[dict], init_error: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    calls = module.calls = []

    def init():
        calls.append("init")
        if init_error:
            raise NVMLError("Driver Not Loaded")

    def fails_or(value):
        if isinstance(value, Exception):
            raise value
        return value

    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(gpus)
    module.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    module.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=h["used"], total=h["total"])
    module.nvmlDeviceGetName = lambda h: h["name"]
    module.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=fails_or(h["bus"]))
    module.nvmlDeviceGetComputeRunningProcesses = lambda h: fails_or([SimpleNamespace(pid=p) for p in h["pids"]])
    return module


def test_every_gpu_in_index_order_with_its_pci_address(monkeypatch):
    module = fake_pynvml([
        {"name": b"NVIDIA H200", "used": 10, "total": 100, "bus": b"00000000:3B:00.0", "pids": [7, 5, 7]},
        {"name": "NVIDIA H200", "used": 0, "total": 100, "bus": NVMLError("Not Supported"), "pids": []},
    ])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert nvml.read_gpus() == [GpuObs(0, "NVIDIA H200", 10, 100, (5, 7), "00000000:3B:00.0"),
                                GpuObs(1, "NVIDIA H200", 0, 100, (), "")]
    assert module.calls == ["init", "shutdown"]


def test_no_driver_or_a_failing_query_is_unavailable_and_shuts_down(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=True))
    with pytest.raises(Unavailable, match="NVML is not available on this host: Driver Not Loaded"):
        nvml.read_gpus()
    module = fake_pynvml([{"name": b"x", "used": 0, "total": 1, "bus": b"0", "pids": []}])

    def lost(handle):
        raise NVMLError("GPU is lost")

    module.nvmlDeviceGetMemoryInfo = lost
    monkeypatch.setitem(sys.modules, "pynvml", module)
    with pytest.raises(Unavailable, match="NVML query failed: GPU is lost"):
        nvml.read_gpus()
    assert module.calls == ["init", "shutdown"]
