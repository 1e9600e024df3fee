"""nftables as the consumer of a multi-host file's rulesets: `nft -c -f FILE` (check only: parses the ruleset
and validates it against the kernel's nf_tables, needs CAP_NET_ADMIN) for every host's ruleset."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fixtures.nft_check import why_not_usable

TIMEOUT_S = 30


def usable() -> str | None:
    return why_not_usable()


def check(ruleset: Path) -> str | None:
    """nft's complaint about the ruleset (None: it loads)."""
    done = subprocess.run(["nft", "-c", "-f", str(ruleset)], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)
    if done.returncode == 0 and not done.stderr.strip():
        return None
    return (done.stderr.strip() or f"exit {done.returncode}")[-1500:]


# Rulesets per `nft -c` call: one transaction of thousands of tables fails in the kernel on its own
# ("Could not process rule"), so they go in chunks.
CHUNK = 40


def check_all(rulesets: list[Path], work: Path) -> dict[Path, str]:
    """nft's complaint per ruleset it refuses: `nft -c` over chunks of them (each ruleset has its own table,
    named after its deployment), then each ruleset of a refused chunk alone."""
    work.mkdir(parents=True, exist_ok=True)
    refused: dict[Path, str] = {}
    for start in range(0, len(rulesets), CHUNK):
        chunk = rulesets[start:start + CHUNK]
        together = work / f"chunk-{start}.nft"
        together.write_text("".join(f'include "{path}"\n' for path in chunk))
        complaint = check(together)
        if complaint is None:
            continue
        alone = {path: c for path in chunk if (c := check(path)) is not None}
        assert alone, f"nft -c refused a chunk of rulesets, yet none alone: {complaint}"
        refused.update(alone)
    return refused
