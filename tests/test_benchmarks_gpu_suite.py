"""benchmarks/gpu_suite.py: the smoke run of every section on the CPU (so the suite
cannot rot while no GPU is around: it runs in the default test run, on the synthetic
toy folder, one torch thread, fixed seeds), --only, the report page, the docs' three commands
and the install script. The suite's running of sections (errors, budgets, resuming):
test_benchmarks_gpu_run_sections.py; the sections' pieces a CPU can check:
test_benchmarks_gpu_speedrun.py, test_benchmarks_gpu_peer.py, test_benchmarks_gpu_sections.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_suite_helpers import BENCHMARKS, REPO, SECTIONS, common, plan


def _suite(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """The suite in smoke mode on the synthetic toy folder (the same images everywhere)."""
    env = dict(os.environ, HASTEN_CACHE=str(tmp / "cache"), HASTEN_RUNS=str(tmp / "runs"), HASTEN_PROGRESS="0")
    try:
        return subprocess.run([sys.executable, str(BENCHMARKS / "gpu_suite.py"), "--smoke", "--data", "toy", *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:  # say where it was: about 80 s on 2 idle cores
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"the smoke run took over 15 minutes; its output ended:\n{out[-3000:]}")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of every section, then --report: (completed process, {section: record}, out)."""
    tmp = tmp_path_factory.mktemp("gpu-suite")
    done = _suite(tmp, "--out", str(tmp / "out"))
    records = {p.stem: json.loads(p.read_text()) for p in (tmp / "out").glob("*.json")}
    return done, records, tmp / "out"


@pytest.mark.slow
def test_smoke_runs_every_section_and_ends_with_the_table(smoke):
    done, records, _ = smoke
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(records) == sorted(SECTIONS)
    table = done.stdout[done.stdout.rindex("section "):]
    assert "all sections done" in done.stdout
    for name in SECTIONS:
        r = records[name]
        assert r["section"] == name and r["smoke"] is True
        assert r["status"] == "ok", r.get("error")
        assert r["wall_s"] > 0 and r["budget_s"] == plan.SMOKE.budget_s[name]
        cond = r["conditions"]
        assert len(cond["load_average_before"]) == 3 and cond["matmul_gflops_after"] > 0
        assert cond["environment"]["torch"] == torch.__version__
        assert cond["environment"]["torch_threads"] == 1  # the smoke run's fixed thread count
        assert set(r["headline"]) == {"key", "n", "spread"}
        assert any(line.startswith(name) for line in table.splitlines()), table


@pytest.mark.slow
def test_smoke_speedrun_numbers_are_consistent(smoke):
    s = smoke[1]["speedrun"]
    row = s["jobs"][plan.SMOKE.speedrun_presets[0]]
    n = plan.SMOKE.speedrun_runs
    assert row["status"] == "ok" and row["n_runs"] == len(row["runs"]) == n and not s["cut_short"]
    assert [r["round"] for r in row["runs"]] == list(range(n)) and [r["seed"] for r in row["runs"]] == list(range(n))
    assert all(0 <= r["tta_accuracy"] <= 1 and r["time_s"] > 0 for r in row["runs"])
    assert row["accuracy"]["mean"] == pytest.approx(sum(r["tta_accuracy"] for r in row["runs"]) / n)
    assert row["time_s"]["mean"] == pytest.approx(sum(r["time_s"] for r in row["runs"]) / n)
    t = common.t_quantile(0.975, n - 1)
    assert row["time_s"]["ci95"] == pytest.approx(t * row["time_s"]["std"] / n ** 0.5)
    assert row["flops_per_run"] > 0 and row["warmup_run"]["seed"] == 10_000
    assert row["achieved_tflops"] == pytest.approx(row["flops_per_run"] / row["time_s"]["mean"] / 1e12)
    assert s["device_matmul_tflops"] > 0 and s["device_matmul_dtype"] == "float32"
    # No upper bound: on a busy CPU the matmul probe can land in a slow moment; the ratio must hold.
    assert row["fraction_of_matmul_rate"] == pytest.approx(row["achieved_tflops"] / s["device_matmul_tflops"])


@pytest.mark.slow
def test_smoke_peer_converts_the_data_and_counts_a_skip(smoke):
    p = smoke[1]["speedrun"]["jobs"]["peer"]
    assert p["status"] == "skipped" and p["skipped"] == "needs CUDA" and p["runs"] == []
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
    assert all(0 <= r["final_accuracy"]["mean"] <= 1 and r["time_s"]["mean"] > 0 for r in a["rungs"])
    assert all(r["reached"] <= r["n_runs"] for r in a["rungs"])
    assert sorted(a["orders"][0]) == sorted(name for name, _ in LADDER)
    # The peer was skipped on the CPU: the target is hasten's own speedrun mean, read from that section.
    assert a["target"] == records["speedrun"]["jobs"][plan.SMOKE.speedrun_presets[0]]["accuracy"]["mean"]
    assert "speedrun" in a["target_source"]


@pytest.mark.slow
def test_smoke_echo_compares_no_echo_fixed_and_auto_behind_slow_storage(smoke):
    e = smoke[1]["echo"]
    assert list(e["configs"]) == ["e=1", *(f"e={f:g}" for f in plan.SMOKE.echo_factors), "auto"]
    assert all(c["n_runs"] == plan.SMOKE.echo_seeds for c in e["configs"].values())
    assert e["step_time_s"] > 0 and e["upstream_delay_s"] > 0
    assert e["upstream_ratio_measured"] > 1  # the storage delay made the loop wait
    assert all(r["storage_ratio"] > 0 for runs in e["runs"].values() for r in runs)
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
    for r in t["training_step"]:  # fp32 rows ran with TF32 off
        if r["config"].startswith("fp32"):
            assert r["tf32"] == {"cudnn.allow_tf32": False, "cuda.matmul.allow_tf32": False}
    assert t["loader_speedup"] == pytest.approx(t["loaders"][0]["images_per_s"] / t["loaders"][1]["images_per_s"])
    tests = smoke[1]["tests"]
    assert tests["returncode"] == 0 and tests["failed"] == 0 and tests["errors"] == 0
    if not torch.cuda.is_available():
        assert tests["passed"] == 0 and tests["skipped"] > 0


@pytest.mark.slow
def test_smoke_report_page_is_generated_from_the_json(smoke):
    _, records, out = smoke
    env = dict(os.environ, HASTEN_PROGRESS="0")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_suite.py"), "--report", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    page = (out / "report.md").read_text()
    assert page.startswith("# GPU suite report") and "a smoke run" in page
    for name in SECTIONS:
        assert f"## {name}" in page
        assert records[name]["headline"]["key"].replace("|", "/")[:40] in page
    assert "| rung |" in page and "| fp32 |" in page and "| job |" in page


def test_only_runs_the_chosen_sections(tmp_path):
    done = _suite(tmp_path, "--only", "throughput", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["throughput.json"]


def test_only_rejects_an_unknown_section_in_one_line(tmp_path):
    done = _suite(tmp_path, "--only", "speedrun,warp", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "warp" in done.stderr and "large_batch" in done.stderr
    assert not (tmp_path / "out").exists()


def test_docs_give_three_commands_and_the_report_page(tmp_path):
    text = (REPO / "docs" / "gpu.md").read_text()
    block = text.split("## Three commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 3, commands
    assert "install" in commands[0] and "gpu_suite.py" in commands[1] and "--report" in commands[2]
    assert "two commands" not in text and "three commands" in text


def test_the_install_script_survives_an_empty_wheel_folder(tmp_path):
    """Defect: ``pip install .whl/*.whl`` aborts (a literal '*.whl') when the folder holds no wheel."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env = dict(os.environ, HASTEN_WHEELS=str(wheels), HASTEN_SITE=str(tmp_path / "site"))
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu" / "install.sh"), "--offline"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no wheels" in done.stdout and "airbench" in done.stdout
