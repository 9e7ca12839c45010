"""hasten.recipes.echo's modules import one another without a cycle: read from their source
(imports under ``TYPE_CHECKING`` and inside functions included), and run, each module imported
first in an interpreter that holds none of the package, and the package never reaching up into
the commands or the command line."""

import ast
import subprocess
import sys
from pathlib import Path

import hasten.recipes.echo as package

PACKAGE = package.__name__
ROOT = Path(package.__file__).parent
MODULES = sorted([PACKAGE] + [f"{PACKAGE}.{p.stem}" for p in ROOT.glob("*.py") if p.stem != "__init__"])


def imported_names(path: Path) -> set[str]:
    """Every module name an import in ``path`` names (``from A import b``: ``A`` and ``A.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the package, as Python does
                base = ".".join([*PACKAGE.split(".")[: len(PACKAGE.split(".")) - node.level + 1], base]).strip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def edges() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    out = {}
    for name in MODULES:
        path = ROOT / ("__init__.py" if name == PACKAGE else f"{name.rsplit('.', 1)[1]}.py")
        out[name] = {m for m in imported_names(path) if m in MODULES and m != name}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_module_list_covers_the_package():
    # A module missed here would escape both checks below.
    assert {"run", "compare", "config", "data", "sweep", "report", "value"} <= {m.rsplit(".", 1)[1] for m in MODULES}


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_source():
    graph = edges()
    assert find_cycle(graph) is None
    # The reader sees the imports that are there (an empty graph has no cycle either).
    assert graph[f"{PACKAGE}.sweep"] >= {f"{PACKAGE}.budget", f"{PACKAGE}.config", f"{PACKAGE}.data"}
    assert graph[f"{PACKAGE}.budget"] >= {f"{PACKAGE}.config", f"{PACKAGE}.data", f"{PACKAGE}.network"}


def test_the_package_does_not_import_the_commands_or_the_cli():
    for path in ROOT.glob("*.py"):
        upward = {m for m in imported_names(path) if m.startswith(("hasten.commands", "hasten.cli"))}
        assert not upward, f"{path.name} imports {sorted(upward)}"


# Run in one fresh interpreter: before each module is imported first, every module of the
# package is dropped, so no import order leans on one made earlier (torch stays loaded: it
# takes seconds and holds no module of the package).
IMPORT_EACH_FIRST = """
import importlib, sys
import hasten.recipes
modules = sys.argv[1:]
for first in modules:
    for name in [m for m in sys.modules if m == modules[0] or m.startswith(modules[0] + ".")]:
        del sys.modules[name]
    if hasattr(hasten.recipes, "echo"):
        del hasten.recipes.echo
    importlib.import_module(first)
    for name in modules:
        importlib.import_module(name)
    print("ok", first)
"""


def test_each_module_imports_first_in_a_fresh_interpreter():
    assert MODULES[0] == PACKAGE
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH_FIRST, *MODULES], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [w for m in MODULES for w in ("ok", m)]
