"""Build the wheel set the GPU tier needs on a machine that has torch but no SGLang and no network.

The H200 test machines have Python 3.12 and torch 2.11.0+cu130 and nothing can be fetched there, so
everything else travels as wheels, and one device call carries at most 64 MiB. This script downloads
the pinned set in `wheelhouse.txt` for that Python (on a machine with PyPI), drops the members a PD
run on Hopper never loads (FA3's 1.1 GB library, SM100 builds, static libraries, torch-2.12+ NIXL-EP
builds), rewrites each trimmed wheel's RECORD so pip installs it as usual, and packs the result into
chunk directories small enough to travel one per call. A wheel larger than a chunk (smg's, about 100 MB
with its Rust binary) is cut into parts named `WHEEL.partKofN`, with `WHEEL.sha256` beside the first;
run_on_device.sh joins the parts once all have arrived and checks the digest before it installs.

    python3 tests/gpu/wheelhouse.py --out .whl          # .whl is git-ignored
    python3 tests/gpu/wheelhouse.py --dsa               # the DSA set of tests/gpu/dsa, into .whl/dsa
    python3 tests/gpu/wheelhouse.py --v4                # the DeepSeek-V4 set of the same tier, into .whl/v4

`--dsa` builds the set a single DeepSeek-V3.2 server needs (tests/gpu/dsa/README.md): the same pins plus
DeepGEMM, FlashMLA kept in sglang-kernel, and nothing of PD (NIXL, the router). It has its own pool
(`.whl/dsa/all`), so the PD tier's chunks are left as they are. `--v4` is the DSA set plus what SGLang's
DeepSeek-V4 model needs on CUDA (TileLang and its z3, the torch DLPack extension), in `.whl/v4`.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "wheelhouse.txt"
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64", "any"]

# distribution (as in the wheel's file name) -> members never loaded in a PD run on Hopper.
TRIM = {
    # flash_ops is FA3 (the run uses the triton backend); SM100 builds and optional extensions.
    "sglang_kernel": ["sgl_kernel/flash_ops.*.so", "sgl_kernel/sm100/*", "sgl_kernel/infllm_ops*.so",
                      "sgl_kernel/flashmla_ops.*.so"],
    # NIXL-EP is built for torch 2.12-2.14 only; headers and pkg-config files are for building against NIXL.
    "nixl_cu13": ["nixl_ep_cu13/*", "*.data/headers/*", "*.data/data/include/*", "*.data/data/pkgconfig/*"],
    "xgrammar": ["xgrammar/lib/*.a"],
}

# The DSA set (one DeepSeek-V3.2 server, tests/gpu/dsa): DeepGEMM is imported by the DSA backend and
# indexer on CUDA, and FlashMLA (sgl_kernel/flashmla_ops) is its sparse MLA decode; PD is not run, so
# NIXL and the router stay home (measured: ../shared/facts/sglang-dsa.md, "Wheels beyond").
DSA_EXTRA_PINS = ["sgl_deep_gemm==0.1.5.post1"]
DSA_LEFT_OUT = {"nixl", "nixl_cu13", "smg"}
DSA_KEPT = {"sglang_kernel": ["sgl_kernel/flashmla_ops.*.so"]}

# The V4 set (one DeepSeek-V4 server, tests/gpu/dsa --arch v4): the DSA set plus what served the tiny V4 on the
# H200 (../shared/facts/sglang-dsv4.md §2): V4's mHC ops (hc_split_sinkhorn, mhc_pre, mhc_post) are TileLang
# kernels with no torch fallback on CUDA, at sglang 0.5.17's pin; TileLang's libtvm_compiler.so links
# libz3.so.4.15 (z3-solver's); torch-c-dlpack-ext was the 72nd wheel of that run.
V4_EXTRA_PINS = ["tilelang==0.1.11", "z3_solver==4.15.4.0", "torch_c_dlpack_ext==0.1.5"]


def pin_lines(pins: str) -> list[str]:
    """The requirement lines of a pins file: blank lines, comment lines and trailing comments dropped (pip
    reads them as comments; a name taken from one would be a wheel that can never be staged)."""
    found = []
    for line in pins.splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            found.append(requirement)
    return found


def dsa_pins(pins: str) -> str:
    """wheelhouse.txt's pins without what PD alone needs, plus DeepGEMM."""
    kept = [line for line in pin_lines(pins) if _pin_name(line) not in DSA_LEFT_OUT]
    return "\n".join(kept + DSA_EXTRA_PINS) + "\n"


def v4_pins(pins: str) -> str:
    """The DSA set plus TileLang, z3 and the DLPack extension."""
    return dsa_pins(pins) + "\n".join(V4_EXTRA_PINS) + "\n"


TIERS = {"dsa": dsa_pins, "v4": v4_pins}


def pin_names(pins: str) -> list[str]:
    """The distribution names (as in wheel file names) of a pins file's requirements."""
    return [_pin_name(line) for line in pin_lines(pins)]


def unstaged(tier: str, directory: Path, pins: Path = PINS) -> list[str]:
    """The distributions of `tier`'s set (TIERS) with no wheel in `directory` (what run_on_device.sh checks
    before it installs, so a fresh machine that lost earlier calls' chunks says so instead of half-installing)."""
    have = {w.name.split("-", 1)[0].lower() for w in Path(directory).glob("*.whl")}
    return [name for name in pin_names(TIERS[tier](pins.read_text(encoding="utf-8"))) if name not in have]


def _pin_name(line: str) -> str:
    return line.split("==", 1)[0].strip().lower().replace("-", "_")


def trim_patterns(distribution: str, dsa: bool) -> list[str]:
    patterns = TRIM.get(distribution, [])
    if dsa:
        patterns = [p for p in patterns if p not in DSA_KEPT.get(distribution, [])]
    return patterns


def download(out: Path, pins: Path = PINS) -> None:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platform_args,
                    "-d", str(out), "-r", str(pins)], check=True, timeout=1800)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(wheel: Path, patterns: list[str]) -> Path:
    """Rewrite `wheel` without the members matching `patterns`; RECORD lists exactly what remains."""
    trimmed = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename == record_name or any(fnmatch.fnmatch(info.filename, p) for p in patterns):
                continue
            data = src.read(info)
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            lines.append(_record_line(info.filename, data))
        lines.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(lines) + "\n")
    trimmed.replace(wheel)
    return wheel


def split(wheel: Path, limit: int, into: Path) -> list[Path]:
    """`wheel` as itself if it fits in `limit` bytes, else as parts of at most `limit` bytes in `into`:
    WHEEL.part1ofN ... WHEEL.partNofN, and WHEEL.sha256 (the whole wheel's digest, as sha256sum writes it)
    travelling with the first part."""
    size = wheel.stat().st_size
    if size <= limit:
        return [wheel]
    into.mkdir(parents=True, exist_ok=True)
    # The digest line is a few hundred bytes: it rides with part 1, which leaves room for it.
    digest_line = f"{hashlib.sha256(wheel.read_bytes()).hexdigest()}  {wheel.name}\n"
    room = limit - len(digest_line.encode())
    count = -(-size // room)
    parts = []
    with wheel.open("rb") as src:
        for k in range(1, count + 1):
            part = into / f"{wheel.name}.part{k}of{count}"
            part.write_bytes(src.read(room))
            parts.append(part)
    (into / f"{wheel.name}.sha256").write_text(digest_line, encoding="utf-8")
    return parts


_FIRST_PART = re.compile(r"(?P<wheel>.+\.whl)\.part1of\d+")


def _companions(item: Path) -> list[Path]:
    """What travels in the same chunk as `item`: the digest file with a wheel's first part."""
    first = _FIRST_PART.fullmatch(item.name)
    return [item.with_name(first["wheel"] + ".sha256")] if first else []


def _travel_size(item: Path) -> int:
    return item.stat().st_size + sum(c.stat().st_size for c in _companions(item))


def chunk(wheels: list[Path], limit: int) -> list[list[Path]]:
    """First-fit decreasing into bins of at most `limit` bytes: wheels, and the parts `split` made of the
    wheels larger than that (a part's digest file counted with it)."""
    bins: list[tuple[int, list[Path]]] = []
    for wheel in sorted(wheels, key=_travel_size, reverse=True):
        size = _travel_size(wheel)
        for i, (used, members) in enumerate(bins):
            if used + size <= limit:
                bins[i] = (used + size, [*members, wheel])
                break
        else:
            bins.append((size, [wheel]))
    return [[m for member in members for m in (member, *_companions(member))] for _, members in bins]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="default .whl, or .whl/dsa with --dsa, .whl/v4 with --v4")
    tier = parser.add_mutually_exclusive_group()
    tier.add_argument("--dsa", action="store_const", const="dsa", dest="tier",
                      help="the DSA set: + DeepGEMM, FlashMLA kept, no NIXL or router (tests/gpu/dsa)")
    tier.add_argument("--v4", action="store_const", const="v4", dest="tier",
                      help="the DeepSeek-V4 set: the DSA set + TileLang, z3, torch-c-dlpack-ext "
                           "(tests/gpu/dsa --arch v4)")
    parser.add_argument("--chunk-mib", type=int, default=50,
                        help="largest chunk (a call carries 64 MiB in all, the working tree included: 50 leaves it "
                             "about 14 MiB, where 56 had left too little once the committed GPU records grew)")
    parser.add_argument("--no-download", action="store_true", help="only trim and chunk what --out/all holds")
    args = parser.parse_args()
    if args.out is None:
        args.out = Path(".whl") / args.tier if args.tier else Path(".whl")
    pool = args.out / "all"
    pool.mkdir(parents=True, exist_ok=True)
    pins = PINS
    if args.tier:
        pins = args.out / "pins.txt"
        pins.write_text(TIERS[args.tier](PINS.read_text(encoding="utf-8")), encoding="utf-8")
    if not args.no_download:
        download(pool, pins)
    wheels = sorted(pool.glob("*.whl"))
    for wheel in wheels:
        # Both single-server sets keep FlashMLA: V3.2's DSA and V4's dsv4 backend decode with it.
        patterns = trim_patterns(wheel.name.split("-", 1)[0], args.tier is not None)
        if patterns:
            before = wheel.stat().st_size
            trim(wheel, patterns)
            print(f"trimmed {wheel.name}: {before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB")
    for old in [*args.out.glob("c[0-9]*"), args.out / "parts"]:
        if old.is_dir():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    limit = args.chunk_mib * 2**20
    items = [item for wheel in wheels for item in split(wheel, limit, args.out / "parts")]
    for i, members in enumerate(chunk(items, limit), start=1):
        directory = args.out / f"c{i}"
        directory.mkdir()
        for wheel in members:
            (directory / wheel.name).hardlink_to(wheel)
        total = sum(w.stat().st_size for w in members)
        print(f"{directory}: {len(members)} files, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
