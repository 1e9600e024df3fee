"""The kernel metadata the build emits next to each fatbin (<module>.json, written by kernels/kernel_metadata.cpp
from the same headers the kernels are instantiated from): kernel names, threads per CTA, dynamic shared memory
and the parameter struct's layout. The launchers read it instead of keeping hand-made copies of the .cu."""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KernelInfo:
    """One extern "C" kernel of a fatbin. Dynamic shared memory = smem_fixed + smem_per_unit x units, where
    `smem_unit` says what a unit is ("entry": an entry of the CTA's index list; "chunk_page": a page of the
    fused scoring CTA's chunk; "": none). `shape` holds the family's own fields (layout, heads, tile, ...)."""

    name: str
    family: str
    threads: int
    smem_fixed: int
    smem_per_unit: int
    smem_unit: str
    shape: dict[str, Any] = field(default_factory=dict)

    def smem_bytes(self, units: int = 0) -> int:
        return self.smem_fixed + self.smem_per_unit * units


@dataclass(frozen=True)
class KernelTable:
    module: str
    kernels: dict[str, KernelInfo]
    params_size: int
    params_fields: tuple[tuple[str, int, int], ...]   # (name, offset, size) in declaration order
    constants: dict[str, int]
    path: pathlib.Path

    def __getitem__(self, name: str) -> KernelInfo:
        return self.kernels[name]

    def __contains__(self, name: object) -> bool:
        return name in self.kernels

    def family(self, family: str) -> dict[str, KernelInfo]:
        return {n: k for n, k in self.kernels.items() if k.family == family}

    def check_params(self, struct: type[ctypes.Structure]) -> None:
        """Raise unless the ctypes mirror has exactly the emitted layout (names, offsets, sizes, total size)."""
        mirror = tuple((name, getattr(struct, name).offset, getattr(struct, name).size)
                       for name, *_ in struct._fields_)
        if mirror == self.params_fields and ctypes.sizeof(struct) == self.params_size:
            return
        diff = next(((a, b) for a, b in itertools.zip_longest(mirror, self.params_fields) if a != b), None)
        raise RuntimeError(
            f"{struct.__qualname__} ({ctypes.sizeof(struct)} B) does not match the parameter struct the kernels "
            f"were built with ({self.params_size} B, {self.path}); first difference (mirror, built): {diff}. "
            f"Rebuild the kernels with kernels/build.sh, or update the ctypes mirror.")


def metadata_path(fatbin: os.PathLike | str) -> pathlib.Path:
    """Where the build put the metadata of `fatbin`: the same name with .json."""
    return pathlib.Path(fatbin).with_suffix(".json")


def load_table(path: os.PathLike | str, module: str) -> KernelTable:
    path = pathlib.Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: kernels/build.sh writes it next to {path.stem}.fatbin "
                                f"(a fatbin without it was built by an older build script; rebuild)") from None
    if raw.get("module") != module:
        raise ValueError(f"{path} describes module {raw.get('module')!r}, expected {module!r}")
    common = {"name", "family", "threads", "smem_fixed", "smem_per_unit", "smem_unit"}
    kernels = {}
    for k in raw["kernels"]:
        kernels[k["name"]] = KernelInfo(**{c: k[c] for c in common},
                                        shape={n: v for n, v in k.items() if n not in common})
    params = raw["params"]
    return KernelTable(module=module, kernels=kernels, params_size=params["size"],
                       params_fields=tuple((f["name"], f["offset"], f["size"]) for f in params["fields"]),
                       constants=dict(raw.get("constants", {})), path=path)
