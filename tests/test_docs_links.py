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

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

PAGES = sorted({ROOT / "README.md", *(ROOT / "docs").rglob("*.md")}
               | ({ROOT / "CONTRIBUTING.md"} if (ROOT / "CONTRIBUTING.md").exists() else set()))

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)


def _prose(text: str) -> str:
    """The text with fenced code blocks, indented code blocks and code spans blanked out."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    lines, out, in_list = text.split("\n"), [], False
    for i, line in enumerate(lines):
        prev_blank = i == 0 or not lines[i - 1].strip()
        if re.match(r"\s*([-*+]|\d+\.)\s", line):
            in_list = True
        elif not line.strip():
            pass
        elif not line.startswith((" ", "\t")):
            in_list = False
        indented_code = line.startswith(("    ", "\t")) and not in_list and (prev_blank or (out and out[-1] == ""))
        out.append("" if indented_code else line)
    return _CODE_SPAN.sub("", "\n".join(out))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", page.read_text()).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[str]:
    text = _prose(page.read_text())
    return _INLINE.findall(text) + _REFERENCE.findall(text)


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
    """The link pattern finds the README's links (so an empty pass above means something)."""
    assert any(t.startswith("docs/") for t in _links(ROOT / "README.md"))


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
