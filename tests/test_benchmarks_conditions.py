"""Every benchmark records the conditions it ran under, measured, not written by hand.

A CPU timing means little without the machine's load and speed at the time, so each
script in benchmarks/ wraps its measurement in ``hasten.environment.MeasuredConditions``
and writes ``cond.as_dict()`` under "conditions" in its JSON. These tests fail when a
benchmark stops doing so: three scripts are run end to end in a tiny configuration,
and every committed result file is checked for the block.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import hasten.environment

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
if str(BENCHMARKS) not in sys.path:  # the scripts import benchmarks/_common.py, as when run from there
    sys.path.insert(0, str(BENCHMARKS))

# Result files measured before the benchmarks recorded their conditions, and not
# measured again since (each one's docs page says so). Nothing may be added here:
# a new or re-measured result must carry its conditions.
LEGACY_RESULTS = {
}


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_conditions(block: dict) -> None:
    for key in ("load_average_before", "load_average_after"):
        assert len(block[key]) == 3 and all(x >= 0 for x in block[key]), key
    assert block["matmul_gflops_before"] > 0 and block["matmul_gflops_after"] > 0
    assert block["wall_s"] >= 0
    env = block["environment"]
    assert env["torch"] and env["python"] and env["cpu_count"] >= 1 and "command" in env


@pytest.fixture
def quick_matmul(monkeypatch):
    """MeasuredConditions times matmuls for a second at each end; a short burst is
    enough to see that the block is written."""
    real = hasten.environment.matmul_gflops
    monkeypatch.setattr(hasten.environment, "matmul_gflops",
                        lambda device="cpu", n=1024, seconds=1.0: real(device, n=256, seconds=0.05))


# Scripts, not the helper modules beside them (benchmarks/pipeline_peers.py: DALI for imagenet_pipeline.py).
# Helpers beside the benchmarks are named _*.py (a harness run as a script included).
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                 if not p.name.startswith("_") and '__name__ == "__main__"' in p.read_text())


def test_scripts_are_found():
    assert {"imagenet_pipeline", "speedrun_command", "large_batch"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_script_measures_its_conditions(script):
    source = (BENCHMARKS / f"{script}.py").read_text()
    assert "MeasuredConditions(" in source, f"{script}.py does not measure its conditions"
    assert '"conditions"' in source, f"{script}.py does not write a conditions block"
    assert "otherwise idle" not in source and '"note":' not in source, \
        f"{script}.py writes a hand-written note on the conditions"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_committed_results_carry_measured_conditions(path):
    if path.name in LEGACY_RESULTS:
        pytest.skip("measured before benchmarks recorded conditions; its docs page says so")
    data = json.loads(path.read_text())
    assert "conditions" in data, f"{path.name} has no conditions block"
    _check_conditions(data["conditions"])


def test_allreduce_scale_writes_conditions(tmp_path, monkeypatch, quick_matmul):
    bench = _load_script("allreduce_scale")
    (tmp_path / "allreduce_emulated.json").write_text((RESULTS / "allreduce_emulated.json").read_text())
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    bench.main()
    data = json.loads((tmp_path / "allreduce_scale.json").read_text())
    _check_conditions(data["conditions"])
    # its own best algorithm is shown, not only the two built ones
    assert "halving_doubling" in data["predicted_time_s"]["calibrated/100MB"]


def test_large_batch_precision_writes_conditions_and_interleaves(tmp_path, quick_matmul):
    bench = _load_script("large_batch_precision")
    out = tmp_path / "p.json"
    assert bench.main(["--device", "cpu", "--width", "8", "--batch", "4", "--warmup", "0", "--steps", "1",
                       "--repeats", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    _check_conditions(data["conditions"])
    orders = [[name for rep, name in data["order"] if rep == r] for r in (0, 1)]
    assert all(sorted(o) == sorted(n for n, _, _ in bench.CONFIGS) for o in orders)


def test_pipeline_throughput_writes_conditions(tmp_path, monkeypatch, quick_matmul):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("a", "b"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for i in range(20):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / label / f"{i}.jpg")
    bench = _load_script("pipeline_throughput")
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["pipeline_throughput.py", "--data", str(tmp_path / "data"),
                                      "--images", "16", "--repeats", "1", "--workers", "0"])
    bench.main()
    data = json.loads((tmp_path / "pipeline_throughput.json").read_text())
    _check_conditions(data["conditions"])
    assert {r["pipeline"] for r in data["rows"]} == {"hasten", "baseline"}
