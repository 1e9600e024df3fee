"""What the GPU machine needs and cannot fetch, packed to travel in device calls of at most 64 MiB.

One payload: the rootfs (rootfs.py) and the SGLang site (the wheels of tests/gpu/wheelhouse.txt, trimmed as
wheelhouse.py trims them, plus both routers, installed here for the machine's Python 3.12), as one tar
stream compressed by zstd with a long window (the routers' Rust libraries shrink by a quarter against their
wheels' deflate), cut into parts of at most `--part-mib`. A manifest holds each part's size and SHA-256 and
the whole stream's, so the machine checks every part before unpacking. Parts go one per call (`stage`), the
last call unpacks them all (`unpack`).

    python3 -m tests.gpu.systemd.payload build --out .gpusd/payload     # here: PyPI and Debian's mirror
    python3 -m tests.gpu.systemd.payload unpack --parts DIR --dest DIR  # on the GPU machine
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.gpu import wheelhouse
from tests.gpu.systemd import rootfs

MANIFEST = "manifest.json"
# Both routers: smg is the deployment's; sglang-router 0.3.2 runs beside it as a plain process for the
# side-by-side column of the fault table (issue 41, item 5).
ROUTER_PINS = ("smg==1.13.0", "sglang_router==0.3.2")
# A call carries 64 MiB in all; the main checkout's tree (about 9 MB) and the harness travel with a part.
DEFAULT_PART_MIB = 50
ZSTD_LEVEL = 19
ZSTD_WINDOW_LOG = 27  # 128 MiB: the unpacking side must pass the same --long


@dataclass(frozen=True)
class Part:
    name: str
    size: int
    sha256: str


def payload_pins(wheelhouse_pins: str, extra: tuple[str, ...] = ROUTER_PINS) -> str:
    """wheelhouse.txt's pins with `extra` added; an extra replaces a pin of the same distribution."""
    names = {wheelhouse._pin_name(line) for line in extra}
    kept = [line.strip() for line in wheelhouse_pins.splitlines()
            if line.strip() and wheelhouse._pin_name(line) not in names]
    return "\n".join(kept + list(extra)) + "\n"


def part_bounds(total: int, limit: int) -> list[tuple[int, int]]:
    """(offset, length) of each part of a `total`-byte stream cut into parts of at most `limit` bytes."""
    if limit <= 0:
        raise ValueError(f"a part must hold at least one byte, not {limit}")
    return [(offset, min(limit, total - offset)) for offset in range(0, total, limit)]


def split(stream: Path, out: Path, limit: int) -> list[Part]:
    """Cut `stream` into out/part-NN files; write and return the manifest's parts."""
    parts = []
    total = stream.stat().st_size
    bounds = part_bounds(total, limit)
    with stream.open("rb") as source:
        for index, (_, length) in enumerate(bounds, start=1):
            data = source.read(length)
            name = f"part-{index:02d}-of-{len(bounds):02d}"
            (out / name).write_bytes(data)
            parts.append(Part(name, length, hashlib.sha256(data).hexdigest()))
    manifest = {"parts": [p.__dict__ for p in parts], "size": total, "sha256": _sha256(stream),
                "zstd_window_log": ZSTD_WINDOW_LOG}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return parts


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def missing_or_bad(manifest: dict, parts_dir: Path) -> list[str]:
    """Each part the manifest names that is absent from `parts_dir` or differs from it, with the reason."""
    problems = []
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            problems.append(f"{part['name']}: missing (stage it: one device call per part)")
        elif path.stat().st_size != part["size"]:
            problems.append(f"{part['name']}: {path.stat().st_size} bytes, the manifest says {part['size']}")
        elif _sha256(path) != part["sha256"]:
            problems.append(f"{part['name']}: SHA-256 differs from the manifest's (a broken transfer)")
    return problems


def reassemble(manifest: dict, parts_dir: Path, stream: Path) -> None:
    """Join the parts into `stream` and check the whole against the manifest."""
    problems = missing_or_bad(manifest, parts_dir)
    if problems:
        raise SystemExit("payload parts not usable:\n  " + "\n  ".join(problems))
    with stream.open("wb") as out:
        for part in manifest["parts"]:
            with (parts_dir / part["name"]).open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 20)
    if _sha256(stream) != manifest["sha256"]:
        raise SystemExit(f"{stream}: the joined parts differ from the manifest's SHA-256")


def install_site(wheels: list[Path], site: Path) -> None:
    """Install `wheels` for CPython 3.12 on x86_64 into `site` here, as pip would there (no bytecode: the
    machine compiles it for its own Python)."""
    platform_args = [arg for p in wheelhouse.PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--target", str(site), "--python-version", "3.12", "--implementation", "cp",
                    "--only-binary=:all:", *platform_args, *map(str, wheels)], check=True, timeout=1800)


def pack(directory: Path, members: list[str], stream: Path, threads: int = 2) -> None:
    """tar `members` of `directory` (numeric owners kept) through zstd into `stream`."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(directory), "-cf", "-", *members],
                           stdout=subprocess.PIPE)
    zstd = subprocess.run(["zstd", f"-{ZSTD_LEVEL}", f"--long={ZSTD_WINDOW_LOG}", f"-T{threads}", "-q", "-f",
                           "-o", str(stream)], stdin=tar.stdout, timeout=3600, check=False)
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait(timeout=60) != 0 or zstd.returncode != 0:
        raise SystemExit(f"packing {directory} failed (tar {tar.returncode}, zstd {zstd.returncode})")


def unpack(stream: Path, dest: Path, zstd: str = "zstd") -> None:
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(f"{zstd} -dc --long={ZSTD_WINDOW_LOG} -q {stream} | tar --numeric-owner -xf - -C {dest}",
                          shell=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"unpacking {stream} into {dest} failed (exit {done.returncode})")


def build(out: Path, work: Path, part_mib: int, reuse_rootfs: Path | None) -> list[Part]:
    work.mkdir(parents=True, exist_ok=True)
    pool = work / "wheels"
    pool.mkdir(exist_ok=True)
    pins = work / "pins.txt"
    pins.write_text(payload_pins(wheelhouse.PINS.read_text(encoding="utf-8")), encoding="utf-8")
    wheelhouse.download(pool, pins)
    for wheel in sorted(pool.glob("*.whl")):
        patterns = wheelhouse.trim_patterns(wheel.name.split("-", 1)[0], dsa=False)
        if patterns:
            wheelhouse.trim(wheel, patterns)
    tree = work / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    if reuse_rootfs is not None:
        subprocess.run(["cp", "-a", str(reuse_rootfs), str(tree / "rootfs")], check=True, timeout=600)
        rootfs.trim(tree / "rootfs")
    else:
        rootfs.build(tree / "rootfs", work / "debootstrap.log")
    install_site(sorted(pool.glob("*.whl")), tree / "site")
    stream = work / "payload.tar.zst"
    pack(tree, ["rootfs", "site"], stream)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return split(stream, out, part_mib * 2**20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download, install, pack and cut the payload (here, with the network)")
    b.add_argument("--out", type=Path, default=Path(".gpusd/payload"))
    b.add_argument("--work", type=Path, default=Path("/var/tmp/pdserve-gpu-payload"))
    b.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB)
    b.add_argument("--reuse-rootfs", type=Path, default=None, help="a debootstrap of rootfs.PACKAGES made earlier")
    u = sub.add_parser("unpack", help="check the staged parts, join and unpack them (on the GPU machine)")
    u.add_argument("--parts", type=Path, required=True)
    u.add_argument("--dest", type=Path, required=True)
    u.add_argument("--zstd", default="zstd")
    args = parser.parse_args()
    if args.command == "build":
        for part in build(args.out, args.work, args.part_mib, args.reuse_rootfs):
            print(f"{part.name}: {part.size / 2**20:.1f} MiB {part.sha256[:12]}")
        return 0
    manifest = json.loads((args.parts / MANIFEST).read_text(encoding="utf-8"))
    stream = args.dest.with_name(args.dest.name + ".tar.zst")
    reassemble(manifest, args.parts, stream)
    unpack(stream, args.dest, args.zstd)
    stream.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
