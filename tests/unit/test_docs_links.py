"""The README and docs/ as a reader follows them: every relative link reaches a file of this tree (and a heading
of it, where it names one), every page in docs/ is linked from the README's table, and every repository path a
page names in backticks exists, so a file that moves or a section that is renamed fails here, not in a reader's
browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# [text](target) and ![alt](target); a target is a URL, a path, a path#anchor or #anchor.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A path from the repository root, as the pages write them in backticks; <...> marks a template.
REPO_PATH = re.compile(r"`((?:pkg|tests|kernels|hosts|nixos-modules|docs|\.ci)/[^`\s<>]*)`")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def _prose(page: Path) -> str:
    """The page without its fenced blocks: a link or path inside code is an example, not a reference."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(page).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            anchors.add(slug if count == 0 else f"{slug}-{count}")  # GitHub numbers repeated headings
            seen[slug] = count + 1
    return anchors


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page)) if not re.match(r"[a-z]+:", t)]


def _broken_links(page: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or root.resolve() not in resolved.parents:
            broken.append(f"{target}: no file {resolved} in the tree")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: {resolved.name} has no heading #{anchor} (it has {sorted(_anchors(resolved))})")
    return broken


def _missing_paths(page: Path, root: Path = ROOT) -> list[str]:
    return [p for p in (m.rstrip(".,;:") for m in REPO_PATH.findall(_prose(page))) if not list(root.glob(p))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = _broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page):
    missing = _missing_paths(page)
    assert not missing, f"{page.relative_to(ROOT)} names paths this tree lacks: {missing}"


def test_every_docs_page_is_in_the_readmes_table():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    orphans = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not orphans, f"docs pages no README link reaches: {orphans}"


def test_the_checker_sees_what_a_reader_would_trip_on(tmp_path):
    """The checks above can fail: a missing file, a missing heading, a link out of the tree and a path that is not
    there are each reported; a good link, a repeated heading's anchor and a link inside a code block are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "there.py").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Title\n\n## `pdserve verify`\n\n## `pdserve verify`\n\n"
                    "[a](missing.md) [b](#title) [c](#nope) [d](../outside.md) [e](#pdserve-verify-1)\n"
                    "[f](../pkg/there.py) [g](https://example.com/x) `pkg/there.py` `pkg/nope.py`\n"
                    "```sh\n[h](nowhere.md) `pkg/gone.py`\n```\n", encoding="utf-8")
    (tmp_path / "outside.md").write_text("")
    # With docs/ as the tree, outside.md and pkg/ exist but lie outside it.
    outside = _broken_links(page, tmp_path / "docs")
    assert [b.split(":")[0] for b in outside] == ["missing.md", "#nope", "../outside.md", "../pkg/there.py"]
    assert [b.split(":")[0] for b in _broken_links(page, tmp_path)] == ["missing.md", "#nope"]
    assert _missing_paths(page, tmp_path) == ["pkg/nope.py"]
