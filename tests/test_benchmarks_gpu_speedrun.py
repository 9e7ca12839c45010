"""benchmarks/gpu/speedrun_sections.py: the jobs run in shuffled rounds and keep every run, a
failing compile job keeps the others', a compiling job and the ablation check their budgets
before they start, and the channel statistics and FLOPs are computed once."""

from __future__ import annotations

import dataclasses
import json
import types

import torch

from gpu_suite_helpers import FakeClock, FakeJob, jobs_record, make_context, plan


def test_a_failing_compile_job_keeps_the_other_jobs_and_their_runs(tmp_path):
    from gpu.speedrun_sections import run_jobs

    ctx = make_context(tmp_path)
    ctx.begin("speedrun")
    jobs = [FakeJob("tiny"), FakeJob("tiny+compile", fail_at=1, compiles=True), FakeJob("peer")]
    rec = jobs_record(jobs)
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

    ctx = make_context(tmp_path)
    ctx.begin("speedrun")
    log = []
    jobs = [FakeJob("tiny", log=log), FakeJob("peer", log=log)]
    rec = jobs_record(jobs)
    run_jobs(ctx, jobs, 6, rec)
    ctx.close()
    runs = [entry for entry in log if entry[1] != "warm"]
    assert log[:2] == [("tiny", "warm"), ("peer", "warm")]  # warm-ups first
    # One run of each job per round, never two rounds of one job in a row.
    assert [sorted(runs[2 * k:2 * k + 2]) for k in range(6)] == [[("peer", k), ("tiny", k)] for k in range(6)]
    assert len({tuple(name for name, _ in runs[2 * k:2 * k + 2]) for k in range(6)}) == 2  # the order changes
    assert rec["order"] == [[i, name] for name, i in runs]
    assert all(len(rec["jobs"][j]["runs"]) == 6 for j in ("tiny", "peer"))


def test_a_compiling_job_waits_for_its_budget_before_the_warm_up(tmp_path):
    """Defect: the compile variant's warm-up and first chunk started whatever the time left."""
    from gpu.speedrun_sections import run_jobs

    clock = FakeClock()
    sizes = dataclasses.replace(plan.SMOKE, budget_s={**plan.SMOKE.budget_s, "speedrun": 100}, compile_s=90.0)
    ctx = make_context(tmp_path, sizes, enforce_budgets=True, clock=clock)
    ctx.begin("speedrun")
    log = []
    jobs = [FakeJob("tiny", clock, 20.0, log=log), FakeJob("tiny+compile", clock, 5.0, compiles=True, log=log)]
    rec = jobs_record(jobs)
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
    ctx = make_context(tmp_path, enforce_budgets=True, clock=clock)
    ctx._dataset = types.SimpleNamespace(name="toy", train=types.SimpleNamespace(images=torch.zeros(4, 3, 8, 8)))
    ctx._mean_std = ([0.5] * 3, [0.25] * 3)
    ctx.results["speedrun"] = {"jobs": {"tiny": {"runs": [{"wall_s": 70.0}], "accuracy": {"mean": 0.5}}}}
    ctx.begin("ablation")  # 60 s of budget; one run took 70 s in the speedrun section
    rec = speedrun_sections.ablation(ctx)
    ctx.close()
    assert calls == [] and rec["cut_short"] and rec["n_runs"] == 0 and "70 s" in rec["skipped_reason"]


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
    ctx = make_context(tmp_path, sizes)
    try:
        ctx.begin("speedrun")
        speedrun_sections.speedrun(ctx)
        ctx.begin("ablation")
        speedrun_sections.ablation(ctx)
    finally:
        ctx.close()
    assert counts == {"stats": 1, "flops": 1}
