"""Every import in hasten/ points down: no module imports one that imports it back, and no
subpackage or module imports a sibling that imports it back (issue 45, item 1).

Imports are read from the source with ``ast``, all of them: at the top of a module, inside a
function (imported on first use), and under ``if TYPE_CHECKING:`` (a cycle a type checker sees
is one a reader must untangle too). An import of a package is an edge to its ``__init__``; the
implicit import of a module's parent packages is not an edge (a package's ``__init__`` that
imports its own modules would otherwise be a cycle with each of them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hasten"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package tree by dotted name (a package by its own name, its ``__init__.py``)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is a module of the tree (``hasten.x.f`` -> ``hasten.x``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict) -> set[str]:
    """The modules of the tree that ``module`` imports, wherever in its source the import is."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                out.add(target)
    return out


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(root, package)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one node
    (Tarjan's algorithm, iterative): untangling it shows the next, if the component holds more."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                if len(comp) > 1:
                    comps.append(_a_cycle(sorted(comp), graph))
    return comps


def _a_cycle(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first node back to itself, inside the component."""
    inside, start = set(comp), comp[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    return paths[node] + [start]
                if child in inside and child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    return comp


def sibling_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """For each package, the imports between its children (its modules and subpackages, each standing
    for everything under it): ``{package: {child: {children it imports}}}``."""
    packages = {m for m in graph if any(o.startswith(m + ".") for o in graph)}
    out: dict[str, dict[str, set[str]]] = {p: {} for p in packages}
    for src, targets in graph.items():
        for dst in targets:
            for p in packages:
                if not (src.startswith(p + ".") and dst.startswith(p + ".")):
                    continue
                a = p + "." + src[len(p) + 1:].split(".")[0]
                b = p + "." + dst[len(p) + 1:].split(".")[0]
                if a != b:
                    out[p].setdefault(a, set()).add(b)
    return out


def _describe(cycle: list[str]) -> str:
    return " -> ".join(cycle)


GRAPH = import_graph()


# Cycles known and left for later, each as the test reports it (none: every one found was untangled).
KNOWN: set[tuple[str, ...]] = set()


def test_the_reader_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.sub.d\n")
    (pkg / "sub" / "d.py").write_text("from ..a import Y\n")
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.a"] == {"pkg.b"} and g["pkg.b"] == {"pkg.c"} and g["pkg.c"] == {"pkg.sub.d"}
    assert g["pkg.sub.d"] == {"pkg.a"}
    (cycle,) = cycles(g)
    assert cycle[0] == cycle[-1] and set(cycle) == {"pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"}
    # at the package's level, sub and the modules a, c import each other
    assert {c[0] for c in cycles(sibling_graph(g)["pkg"])} == {"pkg.a"}


def test_no_module_imports_one_that_imports_it_back():
    found = [c for c in cycles(GRAPH) if tuple(c) not in KNOWN]
    assert not found, "import cycles:\n" + "\n".join(_describe(c) for c in found)


@pytest.mark.parametrize("package", sorted(sibling_graph(GRAPH)))
def test_no_subpackage_imports_a_sibling_that_imports_it_back(package):
    siblings = sibling_graph(GRAPH)[package]
    found = [c for c in cycles(siblings) if tuple(c) not in KNOWN]
    assert not found, f"cycles between {package}'s parts:\n" + "\n".join(_describe(c) for c in found)
