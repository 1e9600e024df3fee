"""What the GPU machine lends the container, and how nspawn is told: pure functions of facts read there.

The GPU machine has root but no running systemd and no systemd-container. The container sees:
- the NVIDIA device nodes (bound read-write; the units' DevicePolicy=closed + DeviceAllow=char-nvidia* then
  decide who may open them) and the directory holding the driver's user-space libraries (read-only, added to
  the container's loader path so `ldconfig -p` finds libcuda there, as Triton looks for it);
- the host's Python at its own paths: the interpreter, its standard library, the virtual environment with
  torch, and its C headers (Triton compiles its launcher against Python.h and the multiarch pyconfig.h);
- the staged SGLang site and this checkout, read-only.
`nspawn_command` runs the rootfs's own systemd-nspawn through the rootfs's own loader, so no host
library is mixed into it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

DEVICE_GLOBS = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")
CUDA_HOME = "/usr/local/cuda"
LOADER = "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
ROOTFS_LIBRARY_PATH = ("usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/systemd")
DRIVER_CONF = "etc/ld.so.conf.d/pdserve-host-nvidia.conf"
HOST_LIBS = "usr/local/lib/pdserve-host"
HOST_LIBS_CONF = "etc/ld.so.conf.d/pdserve-host-libs.conf"


@dataclass(frozen=True)
class PythonLayout:
    executable: str  # the real interpreter behind the venv's python (symlinks resolved)
    links: tuple[str, ...]  # each symlink on the way there (/usr/bin/python3 -> python3.12: the rootfs has neither)
    prefix: str  # the venv
    base_prefix: str
    stdlib: str
    include: str  # Python.h
    multiarch_include: str | None  # Debian/Ubuntu keep pyconfig.h apart, under /usr/include/<multiarch>/
    path_entries: tuple[str, ...]  # sys.path directories that exist
    shared_library: str | None = None  # libpython, where the interpreter links it dynamically (pyenv, uv)

    @classmethod
    def current(cls) -> PythonLayout:
        include = sysconfig.get_paths()["include"]
        multiarch = sysconfig.get_config_var("MULTIARCH")
        version = sysconfig.get_python_version()
        multi = str(Path("/usr/include") / multiarch / f"python{version}") if multiarch else None
        return cls(executable=os.path.realpath(sys.executable), links=tuple(link_chain(sys.executable)),
                   prefix=sys.prefix, base_prefix=sys.base_prefix,
                   stdlib=sysconfig.get_paths()["stdlib"], include=include,
                   multiarch_include=multi if multi and Path(multi).is_dir() else None,
                   path_entries=tuple(p for p in sys.path if p and Path(p).is_dir()),
                   shared_library=_shared_library())


def _shared_library() -> str | None:
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    path = Path(sysconfig.get_config_var("LIBDIR") or "") / (sysconfig.get_config_var("INSTSONAME") or "")
    return str(path) if path.is_file() else None


@dataclass(frozen=True)
class HostFacts:
    python: PythonLayout
    devices: tuple[str, ...]  # absolute paths of the NVIDIA device nodes (and the caps directory)
    driver_dirs: tuple[str, ...]  # directories of libcuda.so.1 and libnvidia-ml.so.1
    site: str  # the staged SGLang site
    checkout: str  # this checkout (the runner, pdserve's sources)
    ninja: str | None = None  # the machine's ninja, where its SGLang Python's environment has none (below)


def link_chain(path: str, limit: int = 40) -> list[str]:
    """Every symlink met from `path` to the file it names, each as an absolute path (the file not included)."""
    chain: list[str] = []
    current = os.path.abspath(path)
    while os.path.islink(current) and len(chain) < limit:
        chain.append(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return chain


def outermost(paths: list[str]) -> list[str]:
    """`paths` without duplicates and without any path inside another one (binding the outer shows it)."""
    unique = sorted({os.path.normpath(p) for p in paths})
    return [p for p in unique if not any(o != p and Path(p).is_relative_to(o) for o in unique)]


def python_binds(layout: PythonLayout) -> list[str]:
    """What must be visible at the same path for the host's Python to run in the container, headers included.
    Nothing of the host's /usr as a whole: only the interpreter's own files."""
    # The prefix in both spellings: a venv reached through a symlink runs under the name it was given.
    wanted = [layout.executable, *layout.links, layout.stdlib, layout.include, layout.prefix,
              os.path.realpath(layout.prefix), *layout.path_entries]
    if layout.shared_library:
        wanted.append(layout.shared_library)
    if layout.multiarch_include:
        wanted.append(layout.multiarch_include)
    # Bare system directories would hide the rootfs's own: never bind these themselves.
    forbidden = {"/", "/usr", "/usr/bin", "/usr/lib", "/usr/include", "/usr/local", "/opt", "/etc", "/var"}
    refused = [p for p in wanted if os.path.normpath(p) in forbidden]
    if refused:
        raise ValueError(f"refusing to bind system directories {refused} into the container; "
                         "run the tier from a virtual environment whose files live under their own directory")
    return outermost(wanted)


def device_nodes(dev: Path = Path("/dev")) -> list[str]:
    found = []
    for pattern in DEVICE_GLOBS:
        found += [str(p) for p in sorted(dev.glob(pattern))]
    return found


# The host's own library directories: bound over the rootfs's they would replace its C library and systemd's.
SYSTEM_LIBRARY_DIRS = frozenset({"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/x86_64-linux-gnu",
                                 "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"})


def driver_dirs(ldconfig_p: str) -> list[str]:
    """Directories of the driver's libcuda.so.1 and libnvidia-ml.so.1, from `ldconfig -p` of the host, outside
    the host's system library directories (the GPU machine lists its driver in /usr/local/nvidia/lib64 and
    again in /lib: only the first can be bound)."""
    dirs = []
    for line in ldconfig_p.splitlines():
        match = re.match(r"\s*(libcuda\.so\.1|libnvidia-ml\.so\.1)\s.*=>\s*(\S+)$", line)
        if match and "x86-64" in line:
            dirs.append(os.path.normpath(str(Path(match.group(2)).parent)))
    usable = sorted(set(dirs) - SYSTEM_LIBRARY_DIRS)
    if dirs and not usable:
        raise ValueError(f"the driver's libraries are only in system directories {sorted(set(dirs))}; "
                         "bind them one by one (not supported by this tier yet)")
    return usable


# Where the container finds a ninja the SGLang environment lacks: on the units' PATH after that environment's bin.
NINJA_INSIDE = "/usr/local/bin/ninja"


def outside_ninja(prefix: str, found: str | None) -> str | None:
    """The machine's ninja (`found`: what PATH gives) when the SGLang Python's environment `prefix` has none
    in its bin. A host's SGLang env has it there (sglang and flashinfer require the `ninja` distribution), and
    the rendered units put that bin first on PATH; the staged site here leaves ninja to the machine's image."""
    if (Path(prefix) / "bin" / "ninja").exists() or found is None:
        return None
    return os.path.realpath(found)


def discover(site: str, checkout: str) -> HostFacts:
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    python = PythonLayout.current()
    return HostFacts(python=python, devices=tuple(device_nodes()), driver_dirs=tuple(driver_dirs(ldconfig)),
                     site=site, checkout=checkout, ninja=outside_ninja(python.prefix, shutil.which("ninja")))


def nspawn_command(root: Path) -> list[str]:
    """The rootfs's systemd-nspawn, started by the rootfs's loader with the rootfs's libraries only."""
    library_path = ":".join(str(root / d) for d in ROOTFS_LIBRARY_PATH)
    return [str(root / LOADER), "--library-path", library_path, str(root / "usr/bin/systemd-nspawn")]


def nspawn_options(facts: HostFacts, site_inside: str, checkout_inside: str) -> tuple[list[str], list[str]]:
    """(read-only binds, further nspawn options) for a container that runs the units on the GPU. The site and
    the checkout appear at paths of their own (`HOST:INSIDE`): the machine may keep them under /tmp or
    /var/tmp, which the units' PrivateTmp= hides."""
    read_only = outermost([*python_binds(facts.python), *facts.driver_dirs])
    # FlashInfer JIT-builds its norm kernels with nvcc from CUDA_HOME (/usr/local/cuda) at the first forward.
    if Path(CUDA_HOME).is_dir():
        read_only += [f"{os.path.realpath(CUDA_HOME)}:{CUDA_HOME}"]
    if facts.ninja:
        read_only += [f"{facts.ninja}:{NINJA_INSIDE}"]
    read_only += [f"{facts.site}:{site_inside}", f"{facts.checkout}:{checkout_inside}"]
    options = [f"--bind={node}" for node in facts.devices]
    # The journal stays inside the container (the host has no journald to link it to); the units' own
    # LimitMEMLOCK=infinity needs a hard limit nspawn does not lower (NIXL/UCX pin memory).
    options += ["--link-journal=no", "--rlimit=RLIMIT_MEMLOCK=infinity", "--rlimit=RLIMIT_NOFILE=1048576"]
    return read_only, options


def loader_conf(facts: HostFacts) -> str:
    """The container's ld.so.conf.d entry for the driver's libraries."""
    return "".join(f"{d}\n" for d in facts.driver_dirs)


def missing_libraries(ldd_output: str) -> list[str]:
    """Sonames that `ldd` reports as 'not found' (the host's Python needs them; the rootfs lacks them)."""
    return sorted(set(re.findall(r"^\s*(\S+) => not found", ldd_output, re.MULTILINE)))


def world_usable(mode: int, write: bool) -> bool:
    want = stat.S_IROTH | (stat.S_IWOTH if write else stat.S_IXOTH)
    return mode & want == want
