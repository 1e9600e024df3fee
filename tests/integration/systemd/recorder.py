"""A recorder that stands in for every tool a unit executes (numactl, the SGLang Python, pdserve), so
the container tier can compare what real systemd hands a process with what pdserve meant to run.

Each tool path gets a /bin/sh wrapper (`exec python record.py "$0" "$@"`: "$0" is the path systemd
executed). record.py writes the exact bytes of that path, its arguments and its environment as hex into
the unit's working directory (its StateDirectory), in a file named after the unit's invocation ID and what
ran: `main`, `gate-ROLE` for a `wait-ready ROLE` gate, `leave-ROLE` for a worker's ExecStartPre=
`leave-routers ROLE`.
The main process then waits to be stopped, as a server would; the gates exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

RECORDER_DIR = "/opt/pdserve-recorder"

RECORD_PY = '''\
import json, os, sys, time
exe, args = sys.argv[1], sys.argv[2:]
step = {"wait-ready": "gate", "leave-routers": "leave"}.get(args[0] if args else "")
record = {
    "exe": os.fsencode(exe).hex(),
    "argv": [os.fsencode(a).hex() for a in args],
    "env": {k.hex(): v.hex() for k, v in os.environb.items()},
}
# The gates (`pdserve wait-ready ROLE`, `pdserve leave-routers ROLE`) are told apart by their role.
name = "%s-%s.json" % (os.environ.get("INVOCATION_ID", "none"), step + "-" + args[1] if step else "main")
with open(name + ".tmp", "w") as out:
    json.dump(record, out)
os.replace(name + ".tmp", name)
if not step:
    time.sleep(600)
'''


def install(root_path, python: str, tool_paths: list[str]) -> None:
    """Write record.py and one wrapper per tool path into the container rooted at `root_path(inside)`."""
    script = root_path(f"{RECORDER_DIR}/record.py")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(RECORD_PY)
    script.chmod(0o644)
    for tool in tool_paths:
        wrapper = root_path(tool)
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(f'#!/bin/sh\nexec {python} {RECORDER_DIR}/record.py "$0" "$@"\n')
        wrapper.chmod(0o755)
        for parent in wrapper.parents:
            if parent == root_path("/"):
                break
            parent.chmod(0o755)


def read(path: Path) -> dict:
    """A record as bytes: {"exe": bytes, "argv": [bytes], "env": {bytes: bytes}}."""
    raw = json.loads(path.read_text())
    return {
        "exe": bytes.fromhex(raw["exe"]),
        "argv": [bytes.fromhex(a) for a in raw["argv"]],
        "env": {bytes.fromhex(k): bytes.fromhex(v) for k, v in raw["env"].items()},
    }
