"""scripts/mutation.py (mutation testing, run by hand): its module -> tests map and its data file."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_script", REPO / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_every_mapped_module_and_test_file_exists(mutation):
    assert mutation.MODULES
    for name, target in mutation.MODULES.items():
        assert (REPO / target.source).is_file(), name
        assert target.tests, name
        for test in target.tests:
            path, _, function = test.partition("::")
            assert (REPO / path).is_file(), (name, test)
            if function:  # a single test: it must still be defined there
                assert f"def {function.split('[')[0]}(" in (REPO / path).read_text(), (name, test)


def test_equivalence_judgements_parse_and_name_mapped_modules(mutation):
    if sys.version_info < (3, 11):
        pytest.importorskip("tomli")
    judged = mutation.load_equivalents()
    modules = {t.source[:-3].replace("/", ".") for t in mutation.MODULES.values()}
    for name, entry in judged.items():
        assert name.rpartition(".")[0] in modules, name
        assert entry["changed"].strip() and entry["reason"], name


def test_undecorate_keeps_behaviour(mutation):
    source = (
        "import contextlib, torch\n"
        "class A:\n"
        "    @torch.no_grad()\n"
        "    def f(self, x):\n"
        "        return (x * 2).requires_grad\n"
        "@contextlib.contextmanager\n"
        "def g():\n"
        "    yield 3\n"
    )
    rewritten = mutation.undecorate(source)
    assert "@" not in rewritten
    namespace = {}
    exec(compile(rewritten, "<rewritten>", "exec"), namespace)
    import torch

    assert namespace["A"]().f(torch.ones(1, requires_grad=True)) is False  # still under no_grad
    with namespace["g"]() as value:
        assert value == 3
