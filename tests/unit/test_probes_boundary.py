"""pdserve.probes is the only code that reads the host: no other module of the package imports the
modules that reach it (subprocess, sockets, NVML, the openai client) or opens a path under /proc or /sys.
The tree is read with `ast`, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pkg" / "pdserve"
HOST_MODULES = {"subprocess", "socket", "fcntl", "pynvml", "openai"}
# Modules outside probes/ allowed one of them, and why.
ALLOWED = {
    # Runs the SGLang Python's own argument parsers on the rendered argv: a program run, not a host read.
    "check/parsers.py": {"subprocess"},
}


def _outside_probes() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "probes")


def _host_reads(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names if a.name.split(".")[0] in HOST_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in HOST_MODULES:
                found.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in {"open", "Path"}:
            for arg in node.args:
                text = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else (
                    arg.values[0].value if isinstance(arg, ast.JoinedStr) and arg.values
                    and isinstance(arg.values[0], ast.Constant) else "")
                if isinstance(text, str) and text.startswith(("/proc", "/sys")):
                    found.append((text, node.lineno))
    return found


@pytest.mark.parametrize("path", _outside_probes(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_probes_read_the_host(path: Path):
    relative = str(path.relative_to(PACKAGE))
    reads = [(what, line) for what, line in _host_reads(path) if what not in ALLOWED.get(relative, set())]
    assert reads == [], f"{relative} reads the host itself ({reads}); do it through a module of pdserve.probes"


def test_the_boundary_test_sees_host_reads(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("import subprocess\ndef f(pid):\n    from pynvml import nvmlInit\n"
                     "    return open(f'/proc/{pid}/cgroup').read()\n", encoding="utf-8")
    assert _host_reads(probe) == [("subprocess", 1), ("pynvml", 3), ("/proc/", 4)]
