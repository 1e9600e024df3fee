"""pdserve.probes is the only code that reads the host: no other module of the package imports the
modules that reach it (subprocess, sockets, NVML, the openai client), opens a path under /proc or /sys, or
sends an HTTP request (it may open the httpx client the probes use). The tree is read with `ast`, lazy
imports inside functions included."""

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
    # Asks the SGLang Python for its package versions: the same program run, one question earlier.
    "check/sglang_python.py": {"subprocess"},
    # Runs SGLang's benchmark client (`pdserve bench`) with the SGLang Python: a program run, not a host read.
    "bench/client.py": {"subprocess"},
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
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "id", getattr(node.func, "attr", "")) in {"open", "Path"}):
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


# Outside probes, httpx may only open the client (its timeout is the command's option) that the probes
# read through: no request of its own, through httpx's functions or a client's methods.
HTTP_REQUESTS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream", "send"}


def _http_requests(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "httpx":
            found += [(f"from httpx import {a.name}", node.lineno) for a in node.names if a.name != "Client"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "httpx" and node.attr != "Client":
                found.append((f"httpx.{node.attr}", node.lineno))
            elif node.value.id == "client" and node.attr in HTTP_REQUESTS:
                found.append((f"client.{node.attr}", node.lineno))
        elif (isinstance(node, ast.Attribute) and node.attr in HTTP_REQUESTS and isinstance(node.value, ast.Attribute)
              and node.value.attr == "client"):
            found.append((f"*.client.{node.attr}", node.lineno))
    return found


@pytest.mark.parametrize("path", _outside_probes(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_probes_send_http_requests(path: Path):
    relative = str(path.relative_to(PACKAGE))
    requests = _http_requests(path)
    assert requests == [], f"{relative} sends HTTP itself ({requests}); do it through pdserve.probes.http"


def test_the_boundary_test_sees_http_requests(tmp_path: Path):
    probe = tmp_path / "probe.py"
    probe.write_text("import httpx\ndef f(client, ctx):\n    httpx.get('u')\n    client.get('u')\n"
                     "    ctx.client.post('u')\n    with httpx.Client() as c:\n        pass\n", encoding="utf-8")
    assert sorted(_http_requests(probe)) == [("*.client.post", 5), ("client.get", 4), ("httpx.get", 3)]
