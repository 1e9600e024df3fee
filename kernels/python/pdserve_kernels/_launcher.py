"""What the ops' launchers (DsaIndexer, SparseMlaDecode) share: a fatbin's kernels loaded for one device, and the one
cached launcher per device that the functional forms call."""

from __future__ import annotations

import ctypes
import pathlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ._driver import torch_device
from ._metadata import KernelTable


class DeviceKernels:
    """torch's context on the device (default: the current one), the device's SM count and compute capability, and
    the kernel table of the fatbin at `path`, checked against the launcher's parameter struct. The subclass loads the
    module (its kernels' shared-memory opt-in is its own) and guards its per-device caches with _lock (_occ: the
    occupancy per (kernel, shape))."""

    def __init__(self, device, path: pathlib.Path, load_kernel_table: Callable[[pathlib.Path], KernelTable],
                 params: type[ctypes.Structure]) -> None:
        import torch

        self.torch = torch
        self.device = torch_device(torch, device)
        self.props = torch.cuda.get_device_properties(self.device)
        self.num_sms = self.props.multi_processor_count
        self.capability = (self.props.major, self.props.minor)
        self.path = path
        self.kernels = load_kernel_table(path)
        self.kernels.check_params(params)
        self._lock = threading.Lock()
        self._occ: dict[tuple[str, int], int] = {}


L = TypeVar("L")


class PerDevice(Generic[L]):
    """One launcher per CUDA device index, made by `make(device)` on first use (an index-less device is device 0)."""

    def __init__(self, make: Callable[..., L]) -> None:
        self._make = make
        self._made: dict[int, L] = {}
        self._lock = threading.Lock()

    def of(self, device) -> L:
        idx = device.index if device.index is not None else 0
        with self._lock:
            if idx not in self._made:
                self._made[idx] = self._make(device)
            return self._made[idx]
