"""The package's layers, read from its imports: schema -> render -> (probes) -> check / verify / cutover /
launch -> bench (over the cutover) -> cli. An import from a lower layer to a higher one, or a long module that
does not say why it is long, fails here (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pkg" / "pdserve"

# layer -> the layers it may import (itself included). probes read the host and know nothing of
# deployments; the launchers run inside SGLang's Python, which has no pdserve at all.
ALLOWED: dict[str, set[str]] = {
    "schema": {"schema"},
    "probes": {"probes"},
    "render": {"schema", "render"},
    "check": {"schema", "render", "probes", "check"},
    "verify": {"schema", "render", "probes", "verify"},
    "cutover": {"schema", "render", "probes", "verify", "cutover"},
    "launch": {"schema", "probes", "launch"},
    "bench": {"schema", "render", "probes", "cutover", "bench"},
    "cli": {"schema", "render", "probes", "check", "verify", "cutover", "launch", "bench", "cli"},
}
# Run by SGLang's Python (see pdserve.launch): importing pdserve there would fail at run time.
STANDALONE = {"launch/keyed_launch.py", "launch/parse_check.py"}
LONG_MODULE_LINES = 300


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name != "__init__.py")


def _layer(path: Path) -> str | None:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else None


def _imported_layers(path: Path) -> set[tuple[str, int]]:
    """(layer, line) of every pdserve import in the file; `from pdserve import x` names layer x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"pdserve.{a.name}" for a in node.names] if node.module == "pdserve" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "pdserve" and len(parts) > 1 and parts[1] != "__version__":
                found.add((parts[1], node.lineno))
    return found


def test_every_module_belongs_to_a_layer():
    loose = [str(p.relative_to(PACKAGE)) for p in _modules() if _layer(p) is None]
    assert loose == [], f"modules outside every layer: {loose}; put each in one of {sorted(ALLOWED)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers_only(path):
    layer = _layer(path)
    relative = str(path.relative_to(PACKAGE))
    imported = _imported_layers(path)
    if relative in STANDALONE:
        assert imported == set(), f"{relative} runs in SGLang's Python and must not import pdserve: {imported}"
        return
    wrong = sorted((target, line) for target, line in imported if target not in ALLOWED.get(layer, set()))
    assert wrong == [], f"{relative} ({layer}) imports a layer above it or beside it: {wrong}"


def test_the_layer_test_sees_imports(tmp_path):
    # The walker itself: module-level, lazy and `from pdserve import x` imports are all found.
    probe = tmp_path / "probe.py"
    probe.write_text("from pdserve.render.argv import launch\nfrom pdserve import __version__, schema\n"
                     "def f():\n    from pdserve.cli import main\n", encoding="utf-8")
    assert _imported_layers(probe) == {("render", 1), ("schema", 2), ("cli", 4)}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_long_modules_say_why(path):
    lines = path.read_text(encoding="utf-8").count("\n")
    if lines <= LONG_MODULE_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert "Longer than 300 lines" in doc, (
        f"{path.relative_to(PACKAGE)} has {lines} lines: split it, or say in its docstring why not "
        "(a line starting 'Longer than 300 lines because ...')")
