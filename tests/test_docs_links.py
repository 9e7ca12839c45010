"""Every relative link in README.md and docs/ points at a file that exists and, where it
names a heading (``page.md#anchor``), at a heading of that page.

Pages are restructured (a section moved to a results page, a page split): a link left behind
points nowhere, and nothing else notices. Anchors follow GitHub's rule: the heading's text in
lower case, punctuation other than ``-`` and ``_`` dropped, each space a ``-``, and ``-1``,
``-2`` ... after a repeated one. External links (``http``, ``mailto``) are not fetched.
"""

from __future__ import annotations

import ast
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


# The project's own code named in README and docs/: a path (``hasten/decode/image.py``,
# ``tests/test_stream_*.py``) or a dotted name (``hasten.decode.turbojpeg.decode_region``). A
# module moved or renamed leaves its old name in the pages, and nothing else notices.
CODE_PATH = re.compile(r"(?<![\w/.-])(hasten/[\w/.*-]*[\w/*]|(?:benchmarks|tests|scripts)/[\w/*-]*\.py)")
DOTTED = re.compile(r"(?<![\w./-])hasten(?:\.\w+)+")
MUTANT = "__mutmut_"  # mutmut's names for mutants (docs/results/mutation.md), not code


def _defined(path: Path) -> dict[str, ast.AST | None]:
    """The names a module defines at its top level (a class with its node, for its members)."""
    out: dict[str, ast.AST | None] = {}
    todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node if isinstance(node, ast.ClassDef) else None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out[node.id] = None
        else:  # assignments, and definitions under if/try
            todo += list(ast.iter_child_nodes(node))
    return out


def names_code(dotted: str, root: Path = ROOT) -> bool:
    """Whether ``dotted`` is a module of the tree, or a name (or a class's member) defined in one."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:k])
        module = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()), None)
        if module is None:
            continue
        rest = parts[k:]
        if not rest:
            return True
        defined = _defined(module)
        if rest[0] not in defined:
            return False
        node = defined[rest[0]]
        if len(rest) == 1 or node is None:
            return True
        return rest[1] in {getattr(n, "name", None) for n in ast.walk(node)} | {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return False


def stale_code_names(page: Path, root: Path = ROOT) -> list[str]:
    out = []
    for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for path in CODE_PATH.findall(line):
            if not any(root.glob(path.rstrip("/"))):
                out.append(f"line {i}: {path}")
        for dotted in DOTTED.findall(line):
            if MUTANT not in dotted and not names_code(dotted, root):
                out.append(f"line {i}: {dotted}")
    return out


def test_a_moved_module_is_a_stale_name(tmp_path):
    (tmp_path / "hasten" / "decode").mkdir(parents=True)
    (tmp_path / "hasten" / "__init__.py").write_text("")
    (tmp_path / "hasten" / "decode" / "__init__.py").write_text("from hasten.decode.image import decode\n")
    (tmp_path / "hasten" / "decode" / "image.py").write_text(
        "try:\n    import cv2\nexcept ImportError:\n    cv2 = None\n\n\nclass Region:\n    top: int\n\n"
        "    def crop(self):\n        pass\n\n\ndef decode(data):\n    pass\n")
    page = tmp_path / "page.md"
    page.write_text("`hasten/decode/image.py`, `hasten/decode/`, `hasten.decode.image.decode`, `hasten.decode.decode`,\n"
                    "`hasten.decode.image.Region.crop`, `hasten.decode.image.Region.top`, `hasten.decode.image.cv2`\n"
                    "`hasten/data/decode.py`, `hasten.data.turbojpeg`, `hasten.decode.image.resize_box`,\n"
                    "`hasten.decode.image.Region.left`, `hasten.decode.image.x_decode__mutmut_3`\n")
    assert stale_code_names(page, tmp_path) == ["line 3: hasten/data/decode.py", "line 3: hasten.data.turbojpeg",
                                                "line 3: hasten.decode.image.resize_box",
                                                "line 4: hasten.decode.image.Region.left"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_a_page_names_exists(page):
    stale = stale_code_names(page)
    assert not stale, f"{page.relative_to(ROOT)} names code that is not in the tree: " + "; ".join(stale)
