"""`python -m tests.integration.router_compare`: run the faults behind both routers, print one table per tier,
write the record (as root, from the checkout, with the test environment's Python; see --help)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from tests.integration.router_compare.report import TierResult, record, side_by_side

REPO = Path(__file__).resolve().parents[3]
TIERS = ("container", "multihost")


def hardware() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    distro = next((line.split("=", 1)[1].strip().strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                   if line.startswith("PRETTY_NAME=")), platform.system())
    return f"{os.cpu_count()} cores, {memory:.0f} GiB, {distro}, {platform.machine()}"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD")
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def chosen(names: list[str], wanted: list[str] | None) -> list[str]:
    """The faults whose name holds one of `wanted` (all when none is given), in the tier's order."""
    return [n for n in names if not wanted or any(w in n for w in wanted)]


def run_tier(name: str, work: Path, routers: dict[str, str], wanted: list[str] | None, say) -> TierResult:
    if name == "container":
        from tests.integration.router_compare import container_faults

        return container_faults.run(work, chosen(list(container_faults.FAULTS), wanted), routers, say)
    from tests.integration.router_compare import host_faults

    names = {f"{fault} {host}": (fault, host) for fault, host in host_faults.ALL_HOST_FAULTS}
    return host_faults.run(work, [names[n] for n in chosen(list(names), wanted)], routers, say)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.integration.router_compare",
        description="Run the container tier's faults (20 req/s) and the multi-host tier's host faults once behind "
                    "smg (the units as pdserve renders them) and once behind sglang-router 0.3.2 (a drop-in over "
                    "the rendered router unit), in front of the same workers; print one table per tier with both "
                    "routers side by side and write a JSON record. Needs root, systemd-nspawn, debootstrap, ip, "
                    "nft, and a venv with smg 1.13.0, sglang-router 0.3.2 and sglang. Takes 10-30 minutes.")
    parser.add_argument("--tier", choices=[*TIERS, "both"], default="both")
    parser.add_argument("--fault", action="append", metavar="TEXT",
                        help="run only the faults whose name holds TEXT (repeatable; e.g. 'kill -9 prefill', "
                             "'link cut'); default: every fault of the tier")
    parser.add_argument("--out", type=Path, default=None, metavar="PREFIX",
                        help="write PREFIX.txt (the tables) and PREFIX.json (the record); with an existing "
                             "PREFIX.json this run is appended to its runs (default: router-compare-<UTC time> "
                             "in the current directory)")
    parser.add_argument("--hardware", default=None, help="how to name the machine in the record (default: read here)")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch directory (default: a new one under /var/tmp, removed after; the units' "
                             "PrivateTmp= hides /tmp)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    started = datetime.now(UTC)
    prefix = args.out or Path(f"router-compare-{started:%Y%m%dT%H%M%SZ}")
    routers = {"smg": f"smg {version('smg')}", "sglang-router-0.3.2": f"sglang-router {version('sglang-router')}"}
    meta = {"date": started.isoformat(timespec="seconds"), "hardware": args.hardware or hardware(),
            "command": shlex.join(["python", "-m", "tests.integration.router_compare", *argv]),
            "commit": commit(), "versions": {**routers, "sglang": version("sglang")}}

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    tiers: list[TierResult] = []
    with tempfile.TemporaryDirectory(prefix="router-compare-", dir=args.work or "/var/tmp") as scratch:
        work = Path(scratch)
        for name in TIERS:
            if args.tier not in (name, "both"):
                continue
            try:
                tiers.append(run_tier(name, work / f"{name}-tier", routers, args.fault, say))
            except Exception as exc:  # noqa: BLE001 - the other tier still runs, and what ran is still written
                say(f"{name} tier failed: {type(exc).__name__}: {exc}")
                tiers.append(TierResult(name, f"{name} tier: did not run to its end",
                                        [f"{type(exc).__name__}: {exc}"[:2000]], routers))
    meta["seconds"] = round((datetime.now(UTC) - started).total_seconds())
    heading = (f"router comparison, {meta['date']}, {meta['hardware']}, commit {meta['commit']}\n"
               f"command: {meta['command']}\n")
    text = heading + "".join("\n" + side_by_side(tier) for tier in tiers)
    print(text)
    json_path, txt_path = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".txt")
    runs = json.loads(json_path.read_text())["runs"] if json_path.exists() else []
    json_path.write_text(json.dumps({"runs": [*runs, record(meta, tiers)]}, indent=1) + "\n")
    with txt_path.open("a", encoding="utf-8") as out:
        out.write(("\n" if runs else "") + text)
    print(f"wrote {txt_path} and {json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
