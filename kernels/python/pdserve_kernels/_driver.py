"""Thin ctypes binding of the few CUDA driver calls the launchers need (libcuda.so.1, stable C ABI)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int), ("p", ctypes.c_void_p),
                ("dim", ctypes.c_uint * 3)]   # clusterDim {x, y, z}


class _LaunchAttr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


class CudaDriverError(RuntimeError):
    pass


class _Lib:
    _instance: _Lib | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        try:
            self.cu = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:  # no NVIDIA driver on this machine
            raise CudaDriverError(f"cannot load libcuda.so.1 (NVIDIA driver): {exc}") from exc
        cu = self.cu
        vp, ui, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        cu.cuInit.argtypes = [ui]
        cu.cuGetErrorString.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
        cu.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
        cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), i]
        cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
        cu.cuCtxPushCurrent.argtypes = [vp]
        cu.cuCtxPopCurrent.argtypes = [ctypes.POINTER(vp)]
        cu.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        cu.cuFuncSetAttribute.argtypes = [vp, i, i]
        cu.cuLaunchKernel.argtypes = [vp, ui, ui, ui, ui, ui, ui, ui, vp, vp, vp]
        cu.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(i), vp, i, ctypes.c_size_t]
        cu.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), vp,
                                            ctypes.c_char_p]
        cu.cuMemcpyDtoH_v2.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t]
        cu.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        self.has_launch_ex = hasattr(cu, "cuLaunchKernelEx")
        if self.has_launch_ex:
            cu.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), vp, vp, vp]
        self.check(cu.cuInit(0), "cuInit")

    @classmethod
    def get(cls) -> _Lib:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def check(self, res: int, what: str) -> None:
        if res != 0:
            msg = ctypes.c_char_p()
            self.cu.cuGetErrorString(res, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise CudaDriverError(f"{what} failed: CUDA error {res} ({text})")


class Module:
    """A fatbin loaded into the primary context of one device, with its kernels looked up by name."""

    def __init__(self, image: bytes, device_index: int, kernels: dict[str, int]) -> None:
        lib = _Lib.get()
        self._lib = lib
        dev = ctypes.c_int()
        lib.check(lib.cu.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        # torch uses the primary context too, so modules and torch's streams share one context.
        lib.check(lib.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self._image = image  # keep the bytes alive for the module's lifetime
        with self.current():
            self.mod = ctypes.c_void_p()
            lib.check(lib.cu.cuModuleLoadData(ctypes.byref(self.mod), image), "cuModuleLoadData")
            self.fn: dict[str, ctypes.c_void_p] = {}
            for name, dyn_smem in kernels.items():
                f = ctypes.c_void_p()
                lib.check(lib.cu.cuModuleGetFunction(ctypes.byref(f), self.mod, name.encode()),
                          f"cuModuleGetFunction({name})")
                if dyn_smem > 0:  # static + dynamic above 48 KB needs the opt-in
                    lib.check(lib.cu.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                        dyn_smem), f"cuFuncSetAttribute({name})")
                self.fn[name] = f

    class _Current:
        def __init__(self, m: Module) -> None:
            self.m, self.pushed = m, False

        def __enter__(self):
            cur = ctypes.c_void_p()
            self.m._lib.check(self.m._lib.cu.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
            if cur.value != self.m.ctx.value:
                self.m._lib.check(self.m._lib.cu.cuCtxPushCurrent(self.m.ctx), "cuCtxPushCurrent")
                self.pushed = True
            return self

        def __exit__(self, *exc):
            if self.pushed:
                old = ctypes.c_void_p()
                self.m._lib.check(self.m._lib.cu.cuCtxPopCurrent(ctypes.byref(old)), "cuCtxPopCurrent")

    def current(self) -> Module._Current:
        return Module._Current(self)

    def allow_nonportable_cluster(self, name: str) -> None:
        """Let kernel `name` be launched in clusters of more than 8 CTAs (up to 16 on Hopper)."""
        with self.current():
            res = self._lib.cu.cuFuncSetAttribute(self.fn[name], CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            self._lib.check(res, f"cuFuncSetAttribute({name}, non-portable cluster size)")

    def _global(self, name: str) -> tuple[ctypes.c_uint64, int]:
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        with self.current():
            self._lib.check(self._lib.cu.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), self.mod,
                                                              name.encode()), f"cuModuleGetGlobal({name})")
        return ptr, size.value

    def read_global(self, name: str) -> bytes:
        """The bytes of the module's `__device__` variable `name` (extern "C"), after the device is idle: for the
        tuning builds' timelines, which the launchers never read."""
        ptr, size = self._global(name)
        buf = ctypes.create_string_buffer(size)
        with self.current():
            self._lib.check(self._lib.cu.cuMemcpyDtoH_v2(buf, ptr, size), f"cuMemcpyDtoH({name})")
        return buf.raw

    def zero_global(self, name: str) -> None:
        """Zero the module's `__device__` variable `name` (ordered with the legacy default stream)."""
        ptr, size = self._global(name)
        with self.current():
            self._lib.check(self._lib.cu.cuMemsetD8_v2(ptr, 0, size), f"cuMemsetD8({name})")

    def max_active_blocks(self, name: str, block: int, smem: int) -> int:
        """CTAs of kernel `name` that fit on one SM at once with `block` threads and `smem` dynamic bytes."""
        n = ctypes.c_int()
        with self.current():
            self._lib.check(self._lib.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(n), self.fn[name], block, smem), f"cuOccupancyMaxActiveBlocksPerMultiprocessor({name})")
        return n.value

    def launch(self, name: str, grid: tuple[int, int, int], block: int, smem: int, stream: int,
               params: ctypes.Structure, programmatic: bool = False, cooperative: bool = False,
               cluster: int | None = None) -> None:
        """Launch kernel `name` whose single parameter is the struct `params` (passed by value).

        `programmatic` allows the launch to overlap the previous kernel in the stream (the kernel must
        call griddepcontrol.wait before reading that kernel's results). `cooperative` makes the driver
        guarantee that all CTAs are resident at once (or fail the launch), for grid-wide waits. `cluster` groups
        the CTAs along x into thread-block clusters of that many (grid[0] must be a multiple; sm_90+).
        """
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        if (cooperative or cluster) and not self._lib.has_launch_ex:
            raise CudaDriverError("a cooperative or cluster launch needs cuLaunchKernelEx (CUDA driver >= 12.0)")
        if (programmatic or cooperative or cluster) and self._lib.has_launch_ex:
            attrs = []
            if cooperative or programmatic:
                attrs.append(_LaunchAttr(id=CU_LAUNCH_ATTRIBUTE_COOPERATIVE if cooperative
                                         else CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION))
                attrs[-1].value.i = 1
            if cluster:
                attrs.append(_LaunchAttr(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION))
                attrs[-1].value.dim[:] = (cluster, 1, 1)
            arr = (_LaunchAttr * len(attrs))(*attrs)
            cfg = _LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, smem, stream,
                                ctypes.cast(arr, ctypes.POINTER(_LaunchAttr)), len(attrs))
            with self.current():
                self._lib.check(self._lib.cu.cuLaunchKernelEx(ctypes.byref(cfg), self.fn[name], argv, None),
                                f"cuLaunchKernelEx({name})")
            return
        with self.current():
            self._lib.check(
                self._lib.cu.cuLaunchKernel(self.fn[name], grid[0], grid[1], grid[2], block, 1, 1, smem,
                                            ctypes.c_void_p(stream), argv, None),
                f"cuLaunchKernel({name})")


def torch_device(torch, device):
    """The CUDA device (default: torch's current one) with torch's primary context created on it, so the
    modules loaded through the driver and torch's streams share one context."""
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else torch.device(device).index or 0)
    torch.cuda.init()
    torch.empty(1, device=dev)
    return dev


def locate_fatbin(stem: str, env_var: str) -> pathlib.Path:
    """The built `<stem>.fatbin`: $env_var if set, else beside this package (an install), else kernels/build/."""
    here = pathlib.Path(__file__).resolve().parent
    env = os.environ.get(env_var)
    candidates = [pathlib.Path(env)] if env else []
    candidates += [here / f"{stem}.fatbin", here.parent.parent / "build" / f"{stem}.fatbin"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{stem}.fatbin not found (looked in: " + ", ".join(str(c) for c in candidates)
        + f"); build it with kernels/build.sh or set {env_var}")
