"""benchmarks/gpu_suite.py: the smoke run of every section on the CPU (so the suite
cannot rot while no GPU is around: it runs in the default test run, on the synthetic
toy folder, one torch thread, fixed seeds), --only, the error and budget paths, and the
pieces the GPU run depends on that a CPU can check (the plan's budget, the peer's data
format, its served runs interleaved with hasten's, pytest's summary, the report page)."""

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
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

plan = importlib.import_module("gpu.plan")
common = importlib.import_module("_common")
SECTIONS = plan.SECTIONS


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


def _context(tmp_path, sizes=None, **kw):
    from gpu.context import Context

    return Context(device=torch.device("cpu"), sizes=sizes or plan.SMOKE, out=tmp_path, data_path=None, smoke=True,
                   say=lambda line: None, **kw)


class FakeClock:
    """A clock that moves only when told: budgets tested without waiting."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_failing_section_writes_its_error_and_the_next_one_still_runs(tmp_path):
    suite = importlib.import_module("gpu_suite")

    def broken(ctx):
        raise RuntimeError("CUDA out of memory (simulated)")

    def fine(ctx):
        return {"headline": {"key": "fine", "n": 1, "spread": ""}}

    ctx = _context(tmp_path)
    try:
        records = suite.run_sections(["speedrun", "ablation"], ctx, {"speedrun": broken, "ablation": fine})
    finally:
        ctx.close()
    first = json.loads((tmp_path / "speedrun.json").read_text())
    assert first["status"] == "error" and "CUDA out of memory" in first["error"]
    assert "conditions" in first and first["wall_s"] >= 0
    assert json.loads((tmp_path / "ablation.json").read_text())["status"] == "ok"
    assert suite.exit_status(records) == 1
    assert suite.exit_status([{"status": "ok"}, {"status": "skipped"}]) == 0


def test_a_failure_after_finished_runs_keeps_them_in_the_sections_json(tmp_path):
    """Defect: the error record replaced the section's checkpointed runs (a --compile variant
    failing cost the eager runs before it; the same for echo, large batch and ablation)."""
    suite = importlib.import_module("gpu_suite")

    def fails_late(ctx):
        runs = []
        for i in range(3):
            runs.append({"seed": i, "accuracy": 0.9})
            ctx.checkpoint({"runs_so_far": runs})
            assert json.loads((tmp_path / "echo.json").read_text())["runs_so_far"] == runs  # on disk at once
        raise RuntimeError("the compiled variant failed")

    ctx = _context(tmp_path)
    try:
        suite.run_sections(["echo"], ctx, {"echo": fails_late})
    finally:
        ctx.close()
    record = json.loads((tmp_path / "echo.json").read_text())
    assert record["status"] == "error" and "compiled variant" in record["error"]
    assert [r["seed"] for r in record["runs_so_far"]] == [0, 1, 2]


class FakeJob:
    """A speedrun job whose runs take ``seconds`` on ``clock`` (or raise from run ``fail_at`` on)."""

    def __init__(self, name, clock=None, seconds=1.0, fail_at=None, compiles=False, log=None):
        self.name, self.clock, self.seconds, self.fail_at, self.compiles = name, clock, seconds, fail_at, compiles
        self.log = log if log is not None else []

    def _spend(self):
        if self.clock is not None:
            self.clock.t += self.seconds

    def warm(self):
        self.log.append((self.name, "warm"))
        self._spend()
        return {"seed": 10_000, "tta_accuracy": 0.5, "time_s": self.seconds, "wall_s": self.seconds}

    def run(self, i):
        if self.fail_at is not None and i >= self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.log.append((self.name, i))
        self._spend()
        return {"seed": i, "tta_accuracy": 0.9 + i / 100, "time_s": self.seconds}


def _record(jobs):
    return {"jobs": {j.name: {"status": "waiting", "runs": []} for j in jobs}, "order": [], "cut_short": False}


def test_a_failing_compile_job_keeps_the_other_jobs_and_their_runs(tmp_path):
    from gpu.speedrun_sections import run_jobs

    ctx = _context(tmp_path)
    ctx.begin("speedrun")
    jobs = [FakeJob("tiny"), FakeJob("tiny+compile", fail_at=1, compiles=True), FakeJob("peer")]
    rec = _record(jobs)
    run_jobs(ctx, jobs, 4, rec)
    ctx.close()
    on_disk = json.loads((tmp_path / "speedrun.json").read_text())
    for r in (rec, on_disk):
        assert [x["seed"] for x in r["jobs"]["tiny"]["runs"]] == [0, 1, 2, 3]
        assert [x["seed"] for x in r["jobs"]["peer"]["runs"]] == [0, 1, 2, 3]
        assert [x["seed"] for x in r["jobs"]["tiny+compile"]["runs"]] == [0]
        assert r["jobs"]["tiny+compile"]["status"] == "error" and "broke" in r["jobs"]["tiny+compile"]["error"]


def test_jobs_run_in_shuffled_rounds_and_every_run_is_kept(tmp_path):
    from gpu.speedrun_sections import run_jobs

    ctx = _context(tmp_path)
    ctx.begin("speedrun")
    log = []
    jobs = [FakeJob("tiny", log=log), FakeJob("peer", log=log)]
    rec = _record(jobs)
    run_jobs(ctx, jobs, 6, rec)
    ctx.close()
    runs = [entry for entry in log if entry[1] != "warm"]
    assert log[:2] == [("tiny", "warm"), ("peer", "warm")]  # warm-ups first
    # One run of each job per round, never two rounds of one job in a row.
    assert [sorted(runs[2 * k:2 * k + 2]) for k in range(6)] == [[("peer", k), ("tiny", k)] for k in range(6)]
    assert len({tuple(name for name, _ in runs[2 * k:2 * k + 2]) for k in range(6)}) == 2  # the order changes
    assert rec["order"] == [[i, name] for name, i in runs]
    assert all(len(rec["jobs"][j]["runs"]) == 6 for j in ("tiny", "peer"))


def test_the_peer_is_served_one_run_at_a_time_and_interleaved(tmp_path):
    """peer_run.py against a stand-in with airbench 0.1.8's layout (train94 -> utils.train ->
    utils.print_training_details) in its own process: one run per request, between hasten's."""
    from gpu.peer import PeerProcess
    from gpu.speedrun_sections import PeerJob, comparison, run_jobs

    work = _fake_airbench(tmp_path)
    lines = []
    process = PeerProcess(work, tmp_path / "src", lines.append)
    try:
        assert process.info["hyp"] == {"opt": {"train_epochs": 9.9}}
        ctx = _context(tmp_path / "out")
        ctx.begin("speedrun")
        log = []
        hasten = FakeJob("tiny", log=log)
        peer = PeerJob(ctx, process)
        rec = _record([hasten, peer])
        run_jobs(ctx, [hasten, peer], 3, rec)
        ctx.close()
    finally:
        process.close()
    assert process.proc.returncode == 0
    peer_runs = rec["jobs"]["peer"]["runs"]
    assert rec["jobs"]["peer"]["warmup_run"]["tta_accuracy"] == 0.5  # run 0: the warm-up
    assert [r["tta_accuracy"] for r in peer_runs] == [0.51, 0.52, 0.53]
    assert [r["time_s"] for r in peer_runs] == [2.0, 3.0, 4.0] and all(r["wall_s"] > 0 for r in peer_runs)
    assert [name for _, name in rec["order"]].count("peer") == 3 and any("row" in line for line in lines)
    saved = json.loads((tmp_path / "out" / "speedrun.json").read_text())
    assert saved["jobs"]["peer"]["runs"] == peer_runs  # kept with the suite's results, not in scratch space
    delta = comparison(rec["jobs"]["tiny"]["runs"], peer_runs)["accuracy_delta_pt"]  # paired by round
    assert delta["n"] == 3 and delta["mean"] == pytest.approx(100 * (0.91 - 0.52))


def test_a_peer_that_dies_raises_instead_of_hanging(tmp_path):
    from gpu.peer import PeerProcess

    work = _fake_airbench(tmp_path, crash=True)
    process = PeerProcess(work, tmp_path / "src", lambda line: None)
    with pytest.raises(RuntimeError, match="exited with status 3"):
        process.run(1, timeout_s=60)
    process.close()


def test_means_come_with_student_t_intervals():
    # The suite's intervals are hasten.stats' (the exact t quantile: tests/test_stats.py).
    assert plan.pm(common.mean_ci([0.9, 0.92]), 100) == "91.00 ± 12.71"  # t(0.975, 1) = 12.706
    assert plan.pm(common.mean_ci([5.0]), 1, ".1f", " s") == "5.0 s (n=1)"
    assert plan.pm(common.mean_ci([]), 100) == "-"


def test_cudnn_benchmark_and_tf32_set_by_one_section_do_not_reach_the_next(tmp_path):
    """Defect: the speedrun turned cuDNN autotuning on for the rest of the process."""
    suite = importlib.import_module("gpu_suite")
    seen = {}

    def sets_flags(ctx):
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
        return {"headline": {"key": "", "n": 1, "spread": ""}}

    def reads_flags(ctx):
        seen.update(benchmark=torch.backends.cudnn.benchmark, tf32=torch.backends.cuda.matmul.allow_tf32,
                    precision=torch.get_float32_matmul_precision())
        return {"headline": {"key": "", "n": 1, "spread": ""}}

    before = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
              torch.get_float32_matmul_precision())
    ctx = _context(tmp_path)
    try:
        records = suite.run_sections(["speedrun", "ablation"], ctx, {"speedrun": sets_flags, "ablation": reads_flags})
    finally:
        ctx.close()
    assert (seen["benchmark"], seen["tf32"], seen["precision"]) == before
    assert records[0]["torch_settings_restored"]["cudnn.benchmark"] == {"before": before[0], "after": True}
    assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision()) == before


def test_fp32_throughput_rows_run_with_tf32_off_and_the_setting_comes_back(tmp_path, monkeypatch):
    import large_batch_precision
    from gpu.throughput_section import step_images_per_s

    seen = []
    monkeypatch.setattr(large_batch_precision, "images_per_s", lambda *a: seen.append(
        (a[5], torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)) or 1.0)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default for convolutions
    ctx = _context(tmp_path)
    for bf16 in (False, True):
        step_images_per_s(ctx, bf16, False)
    ctx.close()
    assert seen == [(False, False, False), (True, True, torch.backends.cuda.matmul.allow_tf32)]
    assert torch.backends.cudnn.allow_tf32 is True


def test_the_cpu_throughput_width_avoids_onednns_channels_last_crash():
    """The smoke run crashed in ResNet-18's backward (tp_width=4, fp32, channels_last): oneDNN's
    weight gradient of a 1x1 stride-2 convolution in channels_last writes out of bounds for
    fewer than 8 input channels on AVX2 (reproduced: segfault with 1 thread, a hang with 2)."""
    from gpu.throughput_section import check_width

    from hasten.errors import ConfigError

    assert plan.SMOKE.tp_width % 8 == 0 and plan.FULL.tp_width % 8 == 0
    with pytest.raises(ConfigError, match="multiple of 8"):
        check_width(torch.device("cpu"), 4)
    check_width(torch.device("cpu"), 8)
    check_width(torch.device("cuda"), 4)  # not a CPU kernel there


def test_a_compiling_job_waits_for_its_budget_before_the_warm_up(tmp_path):
    """Defect: the compile variant's warm-up and first chunk started whatever the time left."""
    from gpu.speedrun_sections import run_jobs

    clock = FakeClock()
    sizes = dataclasses.replace(plan.SMOKE, budget_s={**plan.SMOKE.budget_s, "speedrun": 100}, compile_s=90.0)
    ctx = _context(tmp_path, sizes, enforce_budgets=True, clock=clock)
    ctx.begin("speedrun")
    log = []
    jobs = [FakeJob("tiny", clock, 20.0, log=log), FakeJob("tiny+compile", clock, 5.0, compiles=True, log=log)]
    rec = _record(jobs)
    run_jobs(ctx, jobs, 10, rec)
    ctx.close()
    assert ("tiny+compile", "warm") not in log  # 80 s left < 20 s (longest warm-up) + 90 s of compiling
    assert rec["jobs"]["tiny+compile"]["status"] == "skipped" and "budget" in rec["jobs"]["tiny+compile"]["skipped"]
    # The rounds stop before the one that would not fit: 20 s (warm-up) + 4 x 20 s = 100 s.
    assert len(rec["jobs"]["tiny"]["runs"]) == 4 and rec["cut_short"] and clock.t <= 100


def test_the_ablation_checks_its_budget_before_the_first_run(tmp_path, monkeypatch):
    from gpu import speedrun_sections

    from hasten.recipes import speedrun as recipe

    calls = []
    monkeypatch.setattr(recipe, "train_run", lambda *a, **k: calls.append("run"))
    monkeypatch.setattr(recipe, "warm_up", lambda *a, **k: calls.append("warm"))
    clock = FakeClock()
    ctx = _context(tmp_path, enforce_budgets=True, clock=clock)
    ctx._dataset = types.SimpleNamespace(name="toy", train=types.SimpleNamespace(images=torch.zeros(4, 3, 8, 8)))
    ctx._mean_std = ([0.5] * 3, [0.25] * 3)
    ctx.results["speedrun"] = {"jobs": {"tiny": {"runs": [{"wall_s": 70.0}], "accuracy": {"mean": 0.5}}}}
    ctx.begin("ablation")  # 60 s of budget; one run took 70 s in the speedrun section
    rec = speedrun_sections.ablation(ctx)
    ctx.close()
    assert calls == [] and rec["cut_short"] and rec["n_runs"] == 0 and "70 s" in rec["skipped_reason"]


def test_pytest_gets_the_time_left_not_its_own_five_minutes(tmp_path):
    """Defect: the tests took 300 s against a 60 s budget."""
    from gpu.pytest_section import timeout_for

    clock = FakeClock()
    ctx = _context(tmp_path, plan.FULL, enforce_budgets=True, clock=clock)
    ctx.begin("tests")
    clock.t = 15.0
    assert timeout_for(ctx) == pytest.approx(plan.FULL.budget_s["tests"] - 15.0)
    assert plan.FULL.tests_timeout_s > plan.FULL.budget_s["tests"]
    ctx.close()


def test_the_overall_budget_skips_sections_it_cannot_hold(tmp_path):
    suite = importlib.import_module("gpu_suite")
    clock = FakeClock()
    ctx = _context(tmp_path, plan.FULL, enforce_budgets=True, clock=clock, overall_s=300.0)
    ran = []

    def slow(ctx):
        ran.append(ctx.section)
        clock.t += 260.0
        return {"headline": {"key": "", "n": 1, "spread": ""}}

    try:
        records = suite.run_sections(["speedrun", "echo", "tests"], ctx,
                                     {"speedrun": slow, "echo": slow, "tests": slow})
    finally:
        ctx.close()
    assert ran == ["speedrun", "tests"]  # 40 s left after the speedrun: echo needs 60, the tests 20
    assert [r["status"] for r in records] == ["ok", "skipped", "ok"]
    skipped = json.loads((tmp_path / "echo.json").read_text())
    assert skipped["status"] == "skipped" and "overall budget: 40 s left of 300 s" in skipped["skipped"]
    assert suite.exit_status(records) == 0


def test_a_rerun_resumes_with_the_sections_not_yet_finished(tmp_path):
    suite = importlib.import_module("gpu_suite")
    out = tmp_path
    for name, status, extra in (("speedrun", "ok", {}), ("ablation", "error", {}),
                                ("echo", "skipped", {"budget_skip": True}), ("large_batch", "skipped", {})):
        (out / f"{name}.json").write_text(json.dumps({"section": name, "status": status, "smoke": False, **extra}))
    assert sorted(suite.finished(out, list(SECTIONS), smoke=False)) == ["large_batch", "speedrun"]
    assert suite.finished(out, list(SECTIONS), smoke=True) == {}


def test_channel_statistics_and_flops_are_computed_once(tmp_path, monkeypatch):
    """Defect: every call of the recipe recomputed them (3.7 s and 2 s per run on CIFAR-10)."""
    from gpu import speedrun_sections

    import hasten.data.normalize as normalize
    from hasten.recipes import speedrun as recipe

    counts = {"stats": 0, "flops": 0}
    real_stats, real_flops = normalize.channel_stats, recipe.flops_per_run

    def stats(images):
        counts["stats"] += 1
        return real_stats(images)

    def flops(r, data):
        counts["flops"] += 1
        return real_flops(r, data)

    monkeypatch.setattr(normalize, "channel_stats", stats)
    monkeypatch.setattr(recipe, "flops_per_run", flops)
    monkeypatch.setattr(recipe, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(recipe, "train_run", lambda *a, **k: recipe.RunResult(0.5, 0.5, 0.1))
    sizes = dataclasses.replace(plan.SMOKE, speedrun_runs=3, ablation_repeats=2, peer=False, matmul_seconds=0.01)
    ctx = _context(tmp_path, sizes)
    try:
        ctx.begin("speedrun")
        speedrun_sections.speedrun(ctx)
        ctx.begin("ablation")
        speedrun_sections.ablation(ctx)
    finally:
        ctx.close()
    assert counts == {"stats": 1, "flops": 1}


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
    if CRASH and run:
        os._exit(3)
    tta_val_acc = 0.5 + run / 100
    total_time_seconds = 1.0 + run
    print_training_details(locals(), is_final_entry=False)
    print_training_details(locals(), is_final_entry=True)  # a module-global call, as airbench 0.1.8 makes
'''


def _fake_airbench(tmp_path: Path, crash: bool = False) -> Path:
    package = tmp_path / "src" / "airbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .lib_airbench94 import train94\n")
    (package / "utils.py").write_text(f"CRASH = {crash}\n" + FAKE_UTILS)
    (package / "lib_airbench94.py").write_text(
        "from . import utils\nhyp = {'opt': {'train_epochs': 9.9}}\n"
        "def train94(run=0, verbose=True):\n    return utils.train(run)\n")
    work = tmp_path / "work"
    (work / "cifar10").mkdir(parents=True)
    return work
