"""scripts/timing_tests.py (run by hand): its mutants still apply, and its page section merges."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("timing_tests_script", REPO / "scripts" / "timing_tests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutant_matches_the_code_exactly_once(script):
    for m in script.MUTANTS:
        assert (REPO / m.path).read_text().count(m.old) == 1, m.name
        assert m.old != m.new, m.name
    assert len({m.name for m in script.MUTANTS}) == len(script.MUTANTS)


def test_every_timing_test_file_exists(script):
    for t in script.TIMING_TESTS:
        assert (REPO / t.split("::")[0]).is_file(), t


def test_the_section_replaces_its_old_self_and_keeps_the_rest(script, tmp_path, monkeypatch):
    page = tmp_path / "mutation.md"
    page.write_text("# Mutation testing\n\nthe table\n")
    monkeypatch.setattr(script, "REPORT_MD", page)
    results = {"mutants": {"mutants": [{"mutant": "m", "old": "a | b", "new": "c", "why": "w", "caught_by": None}],
                           "caught": 0, "of": 1, "conditions": {"date": "today"}}}
    script.write_section(results)
    results["mutants"]["mutants"][0]["caught_by"] = "tests/x.py::test_y"
    results["mutants"]["caught"] = 1
    script.write_section(results)
    text = page.read_text()
    assert text.startswith("# Mutation testing\n\nthe table\n") and text.count(script.BEGIN) == 1
    assert "`tests/x.py::test_y`" in text and "not caught" not in text and "`a \\| b`" in text
