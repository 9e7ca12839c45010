"""benchmarks/gpu_suite.py's running of sections: a failing section writes its error and the
next one still runs, a failure keeps the runs checkpointed before it, torch settings one section
makes do not reach the next, the overall budget skips what it cannot hold, a rerun resumes."""

from __future__ import annotations

import importlib
import json

import torch

from gpu_suite_helpers import SECTIONS, FakeClock, make_context, plan


def test_a_failing_section_writes_its_error_and_the_next_one_still_runs(tmp_path):
    suite = importlib.import_module("gpu_suite")

    def broken(ctx):
        raise RuntimeError("CUDA out of memory (simulated)")

    def fine(ctx):
        return {"headline": {"key": "fine", "n": 1, "spread": ""}}

    ctx = make_context(tmp_path)
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

    ctx = make_context(tmp_path)
    try:
        suite.run_sections(["echo"], ctx, {"echo": fails_late})
    finally:
        ctx.close()
    record = json.loads((tmp_path / "echo.json").read_text())
    assert record["status"] == "error" and "compiled variant" in record["error"]
    assert [r["seed"] for r in record["runs_so_far"]] == [0, 1, 2]


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
    ctx = make_context(tmp_path)
    try:
        records = suite.run_sections(["speedrun", "ablation"], ctx, {"speedrun": sets_flags, "ablation": reads_flags})
    finally:
        ctx.close()
    assert (seen["benchmark"], seen["tf32"], seen["precision"]) == before
    assert records[0]["torch_settings_restored"]["cudnn.benchmark"] == {"before": before[0], "after": True}
    assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision()) == before


def test_the_overall_budget_skips_sections_it_cannot_hold(tmp_path):
    suite = importlib.import_module("gpu_suite")
    clock = FakeClock()
    ctx = make_context(tmp_path, plan.FULL, enforce_budgets=True, clock=clock, overall_s=300.0)
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
