"""Write and read the safetensors format by hand: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the raw bytes.

The tiny DSA model's weights are written with this, so the writer needs only torch (the H200 image has
it; the CPU venv has no `safetensors` package). The reader is for the CPU tests; on the device the real
`safetensors` library reads the file back (`tiny_dsa_model.py --check`), and SGLang's loader loads it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

# torch dtype name -> (safetensors dtype, bytes per element)
DTYPES = {"bfloat16": ("BF16", 2), "float32": ("F32", 4), "float16": ("F16", 2)}
ALIGN = 8  # the header is padded with spaces so the data starts 8-byte aligned (as safetensors writes it)


def header_for(entries: Iterable[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]) -> tuple[bytes, int]:
    """The header bytes (length prefix included) for (name, torch dtype name, shape) in file order, and
    the data size that must follow."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in entries:
        st_dtype, size = DTYPES[dtype]
        n = size
        for dim in shape:
            n *= dim
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % ALIGN)
    return struct.pack("<Q", len(text)) + text, offset


def write(path: Path, entries: Iterable[tuple[str, str, tuple[int, ...], Callable[[], object]]],
          metadata: dict[str, str] | None = None) -> Path:
    """Write (name, torch dtype name, shape, make) in that order; `make()` returns the tensor, called once
    when its bytes are due, so only one tensor is in memory at a time."""
    import torch

    entries = list(entries)
    head, total = header_for([(name, dtype, shape) for name, dtype, shape, _ in entries], metadata or {"format": "pt"})
    written = 0
    with open(path, "wb") as f:
        f.write(head)
        for name, dtype, shape, make in entries:
            t = make().contiguous().cpu()
            if str(t.dtype).removeprefix("torch.") != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name}: made {t.dtype} {tuple(t.shape)}, declared {dtype} {tuple(shape)}")
            data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            f.write(data)
            written += len(data)
    if written != total:
        raise RuntimeError(f"{path}: wrote {written} data bytes, the header promised {total}")
    return path


def read_header(path: Path) -> dict:
    """The JSON header of a safetensors file (without reading its data)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))
