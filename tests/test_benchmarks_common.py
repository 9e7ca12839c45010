"""benchmarks/_common.py: the one place for what every benchmark needs. Its --data default
(beside the checkout, written relative to the working directory, $HASTEN_DATA first), and
the property that made it: no benchmark defines its own statistics, data path or results
folder again."""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

common = importlib.import_module("_common")
SHARED_DATA = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.xz"

# Defined in _common (or hasten.stats, hasten.cpu_time, hasten.cores) only: a second definition is a
# copy that can drift (three benchmarks had their own cpu_seconds, two their own memory reader).
SHARED_NAMES = {"RESULTS", "DEFAULT_DATA", "T95", "t95", "t_quantile", "mean", "sample_std", "mean_std", "stats",
                "mean_ci", "describe", "paired", "paired_differences", "paired_ratios", "add_data_argument",
                "require_data", "plus_minus", "rounded", "runs_path", "readable_json", "write_results",
                "load_results", "memory_bytes", "cpu_seconds", "cpu_s", "own_cpu_s", "tree_cpu_s",
                "descendants", "usable_cores"}


@pytest.mark.parametrize("cwd", [ROOT, BENCHMARKS, ROOT / "docs"])
def test_default_data_is_beside_the_checkout_from_any_directory(cwd):
    before = os.getcwd()
    os.chdir(cwd)
    try:
        default = importlib.reload(common).DEFAULT_DATA  # computed at import, from the working directory
    finally:
        os.chdir(before)
        importlib.reload(common)
    assert not os.path.isabs(default)  # no machine's path in a result
    assert (Path(cwd) / default).resolve() == SHARED_DATA.resolve()
    if cwd == ROOT:
        assert default == os.path.join("..", "shared", "data", "cifar10-jpeg.tar.xz")


def test_data_flag_takes_hasten_data_first(monkeypatch, tmp_path):
    def parsed(*argv):
        p = argparse.ArgumentParser()
        common.add_data_argument(p)
        return p.parse_args(list(argv)).data

    monkeypatch.setenv("HASTEN_DATA", str(tmp_path))
    assert parsed() == str(tmp_path) and parsed("--data", "x") == "x"
    monkeypatch.setenv("HASTEN_DATA", "")  # set but empty: as unset
    assert parsed() == common.DEFAULT_DATA
    with pytest.raises(SystemExit, match="bench: no data at nowhere; pass --data PATH or set HASTEN_DATA"):
        common.require_data("nowhere", "bench")
    common.require_data(tmp_path, "bench")


def test_memory_counts_a_process_and_nothing_for_one_that_is_gone():
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("no /proc/<pid>/smaps_rollup on this system")
    pss, rss = common.memory_bytes([os.getpid()])
    assert 0 < pss <= rss  # this process shares library pages with others: its share is at most all of them
    assert common.memory_bytes([2 ** 22 + 12345]) == (0, 0)  # above the largest pid: no such process


def test_plus_minus_drops_a_spread_that_was_not_measured():
    assert common.plus_minus(12.345, 0.678) == "12.35 ± 0.68"
    assert common.plus_minus(12.345, None, ".0f") == "12"


def test_rounded_keeps_four_significant_digits_and_the_exact_keys():
    import numpy as np
    got = common.rounded({"t": [0.016342864000762347, 12345.678, 3], "lr": 7.071068, "n": np.float32(0.123456),
                          "bad": float("nan"), "name": "x"}, exact=frozenset({"lr"}))
    assert got == {"t": [0.01634, 12350.0, 3], "lr": 7.071068, "n": 0.1235, "bad": None, "name": "x"}


def test_results_round_trip_through_a_summary_and_gzipped_runs(tmp_path):
    runs = [{"case": "a", "steps": [0.1234567, 0.2]}, {"case": "b", "steps": []}]
    out = tmp_path / "bench.json"
    common.write_results(out, {"summary": {"mean": 1 / 3}, "runs": runs, "conditions": {"wall_s": 2.0}})
    raw = tmp_path / "bench.runs.jsonl.gz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.runs.jsonl.gz"]
    summary = json.loads(out.read_text())
    assert "runs" not in summary and summary["runs_file"] == raw.name and summary["summary"]["mean"] == 0.3333
    with gzip.open(raw, "rt") as f:
        assert len(f.read().splitlines()) == 2  # one run a line
    again = common.load_results(out)
    assert again["runs"] == [{"case": "a", "steps": [0.1235, 0.2]}, {"case": "b", "steps": []}]
    assert "runs_file" not in again and again["conditions"] == {"wall_s": 2.0}
    before = raw.read_bytes()
    common.write_results(out, again)
    assert raw.read_bytes() == before  # the same runs, the same bytes: no diff in git
    assert common.load_results(tmp_path / "none.json") is None


def test_readable_json_puts_short_lists_on_one_line():
    text = common.readable_json({"steps": [1, 2, 3], "cases": [{"case": "x" * 60, "shares": [0.1] * 12}]})
    assert '"steps": [1, 2, 3]' in text and '"shares": [0.1, 0.1' in text
    assert json.loads(text) == {"steps": [1, 2, 3], "cases": [{"case": "x" * 60, "shares": [0.1] * 12}]}
    assert max(len(line) for line in text.splitlines()) <= 100


def _defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


MODULES = sorted(p for p in BENCHMARKS.rglob("*.py") if p.name != "_common.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_no_benchmark_defines_the_shared_helpers_again(path):
    again = _defined_names(path) & SHARED_NAMES
    assert not again, f"{path.name} defines {sorted(again)}: import them from _common"


# The scripts, not the helpers beside them (pipeline_peers.py; gpu/peer_run.py runs the peer;
# _*.py, such as the harness _real_script_truth.py that runs other people's scripts).
@pytest.mark.parametrize("path", [p for p in BENCHMARKS.glob("*.py")
                                  if not p.name.startswith("_") and '__name__ == "__main__"' in p.read_text()],
                         ids=lambda p: p.name)
def test_every_benchmark_script_uses_the_common_module(path):
    assert "from _common import" in path.read_text()
