"""benchmarks/gpu_suite.py: the smoke run of every section on the CPU (so the suite
cannot rot while no GPU is around), --only, the error path, and the pieces the GPU
run depends on that a CPU can check (the plan's budget, the peer's data format and
its captured numbers, pytest's summary)."""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import os
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SHARED_DATA = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.xz"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

plan = importlib.import_module("gpu.plan")
SECTIONS = plan.SECTIONS


def _data_args() -> list[str]:
    """The shared CIFAR-10-JPEG when this checkout has it, else the suite's synthetic toy folder."""
    data = os.environ.get("HASTEN_DATA") or (str(SHARED_DATA) if SHARED_DATA.exists() else None)
    return ["--data", data] if data and os.path.exists(data) else ["--data", "no-such-dataset"]


def _suite(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HASTEN_CACHE=str(tmp / "cache"), HASTEN_RUNS=str(tmp / "runs"), HASTEN_PROGRESS="0")
    try:
        return subprocess.run([sys.executable, str(BENCHMARKS / "gpu_suite.py"), "--smoke", *_data_args(), *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as exc:  # say where it was: about 80 s on 2 idle cores
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"the smoke run took over 30 minutes; its output ended:\n{out[-3000:]}")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of every section: (completed process, {section: record})."""
    tmp = tmp_path_factory.mktemp("gpu-suite")
    done = _suite(tmp, "--out", str(tmp / "out"))
    records = {p.stem: json.loads(p.read_text()) for p in (tmp / "out").glob("*.json")}
    return done, records


@pytest.mark.slow
def test_smoke_runs_every_section_and_ends_with_the_table(smoke):
    done, records = smoke
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(records) == sorted(SECTIONS)
    table = done.stdout[done.stdout.rindex("section "):]
    for name in SECTIONS:
        r = records[name]
        assert r["section"] == name and r["smoke"] is True
        assert r["status"] in ("ok", "skipped"), r.get("error")
        assert r["wall_s"] > 0 and r["budget_s"] == plan.SMOKE.budget_s[name]
        cond = r["conditions"]
        assert len(cond["load_average_before"]) == 3 and cond["matmul_gflops_after"] > 0
        assert cond["environment"]["torch"] == torch.__version__
        assert set(r["headline"]) == {"key", "n", "spread"}
        assert any(line.startswith(name) for line in table.splitlines()), table


@pytest.mark.slow
def test_smoke_speedrun_numbers_are_consistent(smoke):
    s = smoke[1]["speedrun"]
    row = s["presets"][0]
    n = plan.SMOKE.speedrun_runs
    assert row["preset"] == plan.SMOKE.speedrun_presets[0]
    assert row["n_runs"] == len(row["runs"]) == n and not row["cut_short"]
    assert all(0 <= r["tta_accuracy"] <= 1 and r["time_s"] > 0 for r in row["runs"])
    assert row["mean_accuracy"] == pytest.approx(sum(r["tta_accuracy"] for r in row["runs"]) / n)
    assert row["mean_time_s"] == pytest.approx(sum(r["time_s"] for r in row["runs"]) / n)
    assert row["flops_per_run"] > 0
    assert row["achieved_tflops"] == pytest.approx(row["flops_per_run"] / row["mean_time_s"] / 1e12)
    assert s["device_matmul_tflops"] > 0 and s["device_matmul_dtype"] == "float32"
    # No upper bound: on a busy CPU the matmul probe can land in a slow moment; the ratio must hold.
    assert row["fraction_of_matmul_rate"] == pytest.approx(row["achieved_tflops"] / s["device_matmul_tflops"])


@pytest.mark.slow
def test_smoke_peer_converts_the_data_and_counts_a_skip(smoke):
    p = smoke[1]["peer"]
    assert p["status"] == "skipped" and p["skipped"] == "needs CUDA" and p["n_runs"] == 0
    assert p["peer"] == "airbench==0.1.8"
    conv = p["conversion"]
    assert conv["round_trip_equal"] is True
    assert conv["shapes"] == {"train": [plan.SMOKE.train_subset, 32, 32, 3], "test": [plan.SMOKE.test_subset, 32, 32, 3]}
    assert len(conv["classes"]) == 10
    assert "found" in p["peer_source"]


@pytest.mark.slow
def test_smoke_ablation_climbs_every_rung_to_the_earlier_sections_target(smoke):
    from hasten.recipes.speedrun import LADDER

    records = smoke[1]
    a = records["ablation"]
    assert [r["rung"] for r in a["rungs"]] == [name for name, _ in LADDER]
    assert all(r["n_runs"] == plan.SMOKE.ablation_repeats for r in a["rungs"])
    assert all(0 <= r["final_accuracy"] <= 1 and r["time_s"] > 0 for r in a["rungs"])
    assert all(r["reached"] <= r["n_runs"] for r in a["rungs"])
    # The peer was skipped on the CPU: the target is hasten's own speedrun mean, read from that section.
    assert a["target"] == records["speedrun"]["presets"][0]["mean_accuracy"]
    assert "speedrun" in a["target_source"]


@pytest.mark.slow
def test_smoke_echo_compares_no_echo_fixed_and_auto_behind_slow_storage(smoke):
    e = smoke[1]["echo"]
    assert list(e["configs"]) == ["e=1", *(f"e={f:g}" for f in plan.SMOKE.echo_factors), "auto"]
    assert all(c["n_runs"] == plan.SMOKE.echo_seeds for c in e["configs"].values())
    assert e["step_time_s"] > 0 and e["upstream_delay_s"] > 0
    assert e["upstream_ratio_measured"] > 1  # the storage delay made the loop wait
    assert e["configs"]["e=1"]["mean_echo_factor"] == 1.0
    assert all(0 <= c["final_accuracy"] <= 1 for c in e["configs"].values())


@pytest.mark.slow
def test_smoke_large_batch_runs_every_batch_and_optimizer_with_one_epoch_budget(smoke):
    lb = smoke[1]["large_batch"]
    rows = {r["config"]: r for r in lb["rows"]}
    for batch in plan.SMOKE.lb_batches:
        for opt in ("sgd", "lars"):
            r = rows[f"batch {batch} {opt}"]
            assert r["n_runs"] == plan.SMOKE.lb_seeds and 0 <= r["accuracy"] <= 1
            # The same epochs for every batch: steps shrink as the batch grows.
            assert r["steps"] == round(lb["epochs"] * (lb["train_images"] // batch))
    assert rows[f"batch {plan.SMOKE.lb_batches[0]} sgd"]["peak_lr"] < rows[f"batch {plan.SMOKE.lb_batches[-1]} sgd"]["peak_lr"]
    bn = [r for r in lb["rows"] if r["part"] == "bn"]
    assert [r["bn_batch"] for r in bn] == [k * plan.SMOKE.lb_replica_batch for k in plan.SMOKE.lb_bn_groups]


@pytest.mark.slow
def test_smoke_throughput_and_tests_sections(smoke):
    t = smoke[1]["throughput"]
    assert [r["config"] for r in t["training_step"]] == ["fp32", "bf16", "fp32 channels_last", "bf16 channels_last"]
    assert all(r["images_per_s"] > 0 for r in t["training_step"] + t["loaders"])
    assert t["training_step"][0]["speedup_vs_fp32"] == 1.0
    assert t["loader_speedup"] == pytest.approx(t["loaders"][0]["images_per_s"] / t["loaders"][1]["images_per_s"])
    tests = smoke[1]["tests"]
    assert tests["returncode"] == 0 and tests["failed"] == 0 and tests["errors"] == 0
    if not torch.cuda.is_available():
        assert tests["passed"] == 0 and tests["skipped"] > 0


def test_only_runs_the_chosen_sections(tmp_path):
    done = _suite(tmp_path, "--only", "peer", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["peer.json"]


def test_only_rejects_an_unknown_section_in_one_line(tmp_path):
    done = _suite(tmp_path, "--only", "speedrun,warp", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "warp" in done.stderr and "large_batch" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_failing_section_writes_its_error_and_the_next_one_still_runs(tmp_path):
    suite = importlib.import_module("gpu_suite")
    from gpu.context import Context

    def broken(ctx):
        raise RuntimeError("CUDA out of memory (simulated)")

    def fine(ctx):
        return {"headline": {"key": "fine", "n": 1, "spread": ""}}

    ctx = Context(device=torch.device("cpu"), sizes=plan.SMOKE, out=tmp_path, data_path=None, smoke=True,
                  say=lambda line: None)
    try:
        records = suite.run_sections(["speedrun", "peer"], ctx, {"speedrun": broken, "peer": fine})
    finally:
        ctx.close()
    first = json.loads((tmp_path / "speedrun.json").read_text())
    assert first["status"] == "error" and "CUDA out of memory" in first["error"]
    assert "conditions" in first and first["wall_s"] >= 0
    assert json.loads((tmp_path / "peer.json").read_text())["status"] == "ok"
    assert suite.exit_status(records) == 1
    assert suite.exit_status([{"status": "ok"}, {"status": "skipped"}]) == 0


def test_the_full_plan_fits_twenty_minutes_with_the_issues_n():
    full = plan.FULL
    assert set(full.budget_s) == set(SECTIONS)
    assert full.total_budget_s + plan.STARTUP_S <= plan.H100_LIMIT_S
    assert full.speedrun_runs >= 20 and full.peer_runs >= 20 and full.echo_seeds >= 3 and full.lb_seeds >= 2
    assert full.lb_batches == (512, 2048, 8192) and full.echo_ratio == 6.0
    assert full.speedrun_presets[0] == "airbench94" and full.train_subset == full.test_subset == 0
    assert set(plan.SMOKE.budget_s) == set(SECTIONS)


def test_large_batch_epochs_fit_the_budget_and_group_bn_reuses_the_plain_config():
    from gpu.large_batch_section import RUN_OVERHEAD_S, epochs_for_budget, plan_configs

    # 16 runs of 50,000 images at 40,000 images/s in 300 s: (300 - 16 * overhead) * 40,000 * 0.8 / 800,000.
    expected = (300 - 16 * RUN_OVERHEAD_S) * 40_000 * 0.8 // (16 * 50_000)
    assert epochs_for_budget(300, 40_000, 16, 50_000, 1, 50) == expected
    assert epochs_for_budget(30, 40_000, 16, 50_000, 6, 50) == 6   # clamped up
    assert epochs_for_budget(1e6, 40_000, 16, 50_000, 6, 50) == 50  # clamped down
    configs, same_as = plan_configs(dataclasses.replace(plan.FULL, lb_bn_groups=(1, 32)))
    labels = [label for label, _, _ in configs]
    assert len(labels) == 7 and "bn group 1 (16 images per BN)" in labels
    assert same_as == {"bn group 32 (512 images per BN)": "batch 512 sgd"}


def test_peer_capture_reads_airbench_final_row_and_keeps_printing():
    from gpu.peer_run import capture_final_rows

    printed = []
    utils = types.SimpleNamespace(print_training_details=lambda v, is_final_entry: printed.append(is_final_entry))
    final = capture_final_rows(utils)
    utils.print_training_details({"tta_val_acc": None, "total_time_seconds": 1.0}, is_final_entry=False)
    assert final == {}
    utils.print_training_details({"tta_val_acc": 0.9312, "total_time_seconds": 3.5, "epoch": "eval"},
                                 is_final_entry=True)
    assert final == {"tta_accuracy": 0.9312, "time_s": 3.5} and printed == [False, True]


def test_peer_sdist_is_checked_against_pypis_hash(tmp_path):
    from gpu.peer import SDIST_NAME, locate_airbench

    from hasten.errors import ConfigError

    fake = tmp_path / SDIST_NAME
    with tarfile.open(fake, "w:gz") as tf:
        body = b"def train94(): pass\n"
        info = tarfile.TarInfo("airbench-0.1.8/airbench/lib_airbench94.py")
        info.size = len(body)
        tf.addfile(info, io.BytesIO(body))
    with pytest.raises(ConfigError, match="not PyPI's"):
        locate_airbench(fake)
    missing = locate_airbench(tmp_path / "absent.tar.gz")
    assert missing["found"] is (missing["kind"] == "installed" and missing.get("version") == "0.1.8")


def test_peer_data_round_trip_detects_a_wrong_layout(tmp_path):
    from gpu.peer import check_converted, convert_for_airbench

    from hasten.data import ImageDataset, Split

    g = torch.Generator().manual_seed(0)
    split = Split(torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=g), torch.arange(6) % 3)
    data = ImageDataset("toy", ["a", "b", "c"], split, split, source="toy")
    conv = convert_for_airbench(data, tmp_path / "cifar10")
    assert conv["shapes"]["train"] == [6, 32, 32, 3]
    saved = torch.load(tmp_path / "cifar10" / "train.pt")
    assert saved["images"].dtype == torch.uint8 and saved["labels"].dtype == torch.int64
    assert torch.equal(saved["images"][2, 5, 7], split.images[2, :, 5, 7])  # pixel (y=5, x=7), NHWC
    assert check_converted(tmp_path / "cifar10", data)
    # Height and width swapped (a wrong layout) is caught by the check.
    torch.save({"images": split.images.transpose(1, 3).contiguous(), "labels": split.labels, "classes": data.classes},
               tmp_path / "cifar10" / "train.pt")
    assert not check_converted(tmp_path / "cifar10", data)


def test_pytest_summary_counts():
    from gpu.pytest_section import parse_summary

    out = "....F.s\n=== short test summary info ===\n3 passed, 1 failed, 2 skipped, 740 deselected, 1 error in 6.27s\n"
    counts = parse_summary(out)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"], counts["deselected"]) == \
        (3, 1, 2, 1, 740)
    assert parse_summary("8 skipped, 744 deselected in 2.93s")["skipped"] == 8


FAKE_UTILS = '''
def print_training_details(variables, is_final_entry):
    print("row", variables.get("tta_val_acc"), variables.get("total_time_seconds"))

def train(run):
    import os
    assert os.path.isdir("cifar10"), "CifarLoader('cifar10') reads from the working directory"
    tta_val_acc = 0.5 + run / 100
    total_time_seconds = 1.0 + run
    print_training_details(locals(), is_final_entry=False)
    print_training_details(locals(), is_final_entry=True)  # a module-global call, as airbench 0.1.8 makes
'''


def test_peer_runner_reads_each_run_through_a_subprocess(tmp_path):
    """peer_run.py against a stand-in with airbench 0.1.8's layout (train94 -> utils.train ->
    utils.print_training_details): working directory, PYTHONPATH, warm-up, runs, budget."""
    from gpu.peer import run_peer

    package = tmp_path / "src" / "airbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .lib_airbench94 import train94\n")
    (package / "utils.py").write_text(FAKE_UTILS)
    (package / "lib_airbench94.py").write_text(
        "from . import utils\nhyp = {'opt': {'train_epochs': 9.9}}\n"
        "def train94(run=0, verbose=True):\n    return utils.train(run)\n")
    work = tmp_path / "work"
    (work / "cifar10").mkdir(parents=True)
    lines = []
    report = run_peer(work, tmp_path / "src", 3, float("inf"), lines.append)
    assert report["warmup_run"]["tta_accuracy"] == 0.5
    assert [r["tta_accuracy"] for r in report["runs"]] == [0.51, 0.52, 0.53]
    assert [r["time_s"] for r in report["runs"]] == [2.0, 3.0, 4.0]
    assert all(r["wall_s"] > 0 for r in report["runs"]) and not report["cut_short"]
    assert report["hyp"] == {"opt": {"train_epochs": 9.9}} and any("row" in line for line in lines)
    cut = run_peer(work, tmp_path / "src", 3, 0.0, lines.append)
    assert len(cut["runs"]) == 1 and cut["cut_short"]
