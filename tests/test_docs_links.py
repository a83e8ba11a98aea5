"""The documentation's relative links lead somewhere, and the README stays short.

Every relative markdown link in README.md, CONTRIBUTING.md (when there is one) and docs/**/*.md
must name a file or folder that exists; a `#fragment` on a link to a markdown file must name one of
its headings (GitHub's anchors). Links inside code blocks and code spans are not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

PAGES = sorted({ROOT / "README.md", *(ROOT / "docs").rglob("*.md")}
               | ({ROOT / "CONTRIBUTING.md"} if (ROOT / "CONTRIBUTING.md").exists() else set()))

_MARKDOWN = MarkdownIt("commonmark")  # rich's dependency: links and headings as GitHub parses them


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page."""
    seen: dict[str, int] = {}
    anchors = set()
    tokens = _MARKDOWN.parse(page.read_text())
    for heading, text in zip(tokens, tokens[1:]):
        if heading.type != "heading_open":
            continue
        slug = re.sub(r"[^\w\- ]", "", text.content.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[str]:
    """Every link and image target of the page (inline or by reference; none from code)."""
    targets = []
    for token in _MARKDOWN.parse(page.read_text()):
        for child in token.children or ():
            if child.type == "link_open":
                targets.append(child.attrs["href"])
            elif child.type == "image":
                targets.append(child.attrs["src"])
    return targets


def _is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in _links(page):
        if not _is_relative(target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and dest.is_file() and unquote(fragment).lower() not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_checker_sees_links():
    """The parser finds the README's links (so an empty pass above means something)."""
    assert any(t.startswith("docs/") for t in _links(ROOT / "README.md"))


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
