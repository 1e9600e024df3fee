"""GPU memory and compute processes through NVML (nvidia-ml-py's `pynvml` module)."""

from __future__ import annotations

from pdserve.probes.observations import GpuObs, Unavailable


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
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                pids = tuple(sorted({p.pid for p in procs}))
            except pynvml.NVMLError:
                pids = ()
            gpus.append(GpuObs(index, name.decode() if isinstance(name, bytes) else str(name),
                               int(memory.used), int(memory.total), pids))
        return gpus
    except pynvml.NVMLError as exc:
        raise Unavailable(f"NVML query failed: {exc}") from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
