"""GPUs through NVML (nvidia-ml-py's `pynvml` module): memory, compute processes, PCI address.

NVML's index order is PCI bus order, the order CUDA uses with CUDA_DEVICE_ORDER=PCI_BUS_ID (which the
reference profile's environment sets), so an index here is the index a deployment's `gpus` names."""

from __future__ import annotations

import contextlib

from pdserve.probes.observations import GpuObs, Unavailable


def _text(value: bytes | str) -> str:
    # nvidia-ml-py returns bytes in older releases, str in newer ones.
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpus() -> list[GpuObs]:
    """Every GPU NVML sees, in NVML's index order (PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    try:
        import pynvml
    except ImportError:
        raise Unavailable("nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise Unavailable(f"NVML is not available on this host: {exc}") from None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
            except pynvml.NVMLError:
                bus_id = ""  # only `pdserve check` needs it, and says so when a GPU's node is unknown
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                pids = tuple(sorted({p.pid for p in procs}))
            except pynvml.NVMLError:
                pids = ()
            gpus.append(GpuObs(index, _text(name), int(memory.used), int(memory.total), pids, _text(bus_id)))
        return gpus
    except pynvml.NVMLError as exc:
        raise Unavailable(f"NVML query failed: {exc}") from None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
