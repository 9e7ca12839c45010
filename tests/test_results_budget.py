"""benchmarks/results/ stays small enough to review: every file under a budget, the folder too.

A results file is read by people (the summary JSON, indented, with the conditions and each
configuration's statistics) or kept as evidence (the raw runs, ``NAME.runs.jsonl.gz``, one run
a line, floats rounded by ``benchmarks/_common.write_results``). 27 of the folder's 31 MB were
once four reruns of one benchmark with every per-step float on a line of its own; these tests
fail when a file like that is added again. A superseded rerun is removed (it stays in git
history) and its results page says where to find it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
FILE_BUDGET = 512 * 1024
FOLDER_BUDGET = 5 * 1024 * 1024
FILES = sorted(p for p in RESULTS.iterdir() if p.is_file() and not p.name.startswith("."))


def test_results_are_found():
    assert any(p.suffix == ".json" for p in FILES) and any(p.name.endswith(".runs.jsonl.gz") for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_results_file_is_within_its_budget(path):
    size = path.stat().st_size
    assert size <= FILE_BUDGET, (
        f"{path.name} is {size / 1024:.0f} KB, over the {FILE_BUDGET // 1024} KB budget: write the summary "
        f"and the raw runs with benchmarks/_common.write_results (runs gzipped, floats rounded), and "
        f"remove superseded reruns")


def test_the_results_folder_is_within_its_budget():
    total = sum(p.stat().st_size for p in FILES)
    assert total <= FOLDER_BUDGET, f"benchmarks/results holds {total / 2**20:.1f} MB, over {FOLDER_BUDGET // 2**20} MB"


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".json"], ids=lambda p: p.name)
def test_a_summary_names_raw_runs_that_exist_and_read(path):
    summary = json.loads(path.read_text())
    if "runs_file" not in summary:
        return
    raw = RESULTS / summary["runs_file"]
    assert raw.exists(), f"{path.name} names {raw.name}, which is not there"
    with gzip.open(raw, "rt") as f:
        runs = [json.loads(line) for line in f]
    assert runs and all(isinstance(r, dict) for r in runs)


@pytest.mark.parametrize("path", [p for p in FILES if p.name.endswith(".runs.jsonl.gz")], ids=lambda p: p.name)
def test_raw_runs_belong_to_a_summary(path):
    summary = RESULTS / (path.name.removesuffix(".runs.jsonl.gz") + ".json")
    assert summary.exists(), f"{path.name} has no summary {summary.name} beside it"
    assert json.loads(summary.read_text()).get("runs_file") == path.name
