"""Every relative link in README.md and docs/ points at a file that exists and, where it
names a heading (``page.md#anchor``), at a heading of that page.

Pages are restructured (a section moved to a results page, a page split): a link left behind
points nowhere, and nothing else notices. Anchors follow GitHub's rule: the heading's text in
lower case, punctuation other than ``-`` and ``_`` dropped, each space a ``-``, and ``-1``,
``-2`` ... after a repeated one. External links (``http``, ``mailto``) are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose(page.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def test_slug_follows_githubs_rule():
    assert slug("At a real target: all of CIFAR-10-JPEG, the speedrun network, 75%") == \
        "at-a-real-target-all-of-cifar-10-jpeg-the-speedrun-network-75"
    assert slug("`hasten echo`") == "hasten-echo"
    assert slug("Through hasten's whole pipeline: `EchoStage` after `ShardLoader` (`--pipeline stage`)") == \
        "through-hastens-whole-pipeline-echostage-after-shardloader---pipeline-stage"


def test_pages_have_links():
    assert sum(len(links(p)) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
