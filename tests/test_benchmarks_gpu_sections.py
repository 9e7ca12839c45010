"""What a CPU can check of benchmarks/gpu/'s plan and other sections: the plan's intervals, fp32
throughput rows with TF32 off, the CPU throughput width, pytest's time left and summary, and the
large-batch section's epochs for its budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpu_suite_helpers import FakeClock, common, make_context, plan


def test_means_come_with_student_t_intervals():
    # The suite's intervals are hasten.stats' (the exact t quantile: tests/test_stats.py).
    assert plan.pm(common.mean_ci([0.9, 0.92]), 100) == "91.00 ± 12.71"  # t(0.975, 1) = 12.706
    assert plan.pm(common.mean_ci([5.0]), 1, ".1f", " s") == "5.0 s (n=1)"
    assert plan.pm(common.mean_ci([]), 100) == "-"


def test_fp32_throughput_rows_run_with_tf32_off_and_the_setting_comes_back(tmp_path, monkeypatch):
    import large_batch_precision
    from gpu.throughput_section import step_images_per_s

    seen = []
    monkeypatch.setattr(large_batch_precision, "images_per_s", lambda *a: seen.append(
        (a[5], torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)) or 1.0)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # PyTorch's default for convolutions
    ctx = make_context(tmp_path)
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


def test_pytest_gets_the_time_left_not_its_own_five_minutes(tmp_path):
    """Defect: the tests took 300 s against a 60 s budget."""
    from gpu.pytest_section import timeout_for

    clock = FakeClock()
    ctx = make_context(tmp_path, plan.FULL, enforce_budgets=True, clock=clock)
    ctx.begin("tests")
    clock.t = 15.0
    assert timeout_for(ctx) == pytest.approx(plan.FULL.budget_s["tests"] - 15.0)
    assert plan.FULL.tests_timeout_s > plan.FULL.budget_s["tests"]
    ctx.close()


def test_pytest_summary_counts():
    from gpu.pytest_section import parse_summary

    out = "....F.s\n=== short test summary info ===\n3 passed, 1 failed, 2 skipped, 740 deselected, 1 error in 6.27s\n"
    counts = parse_summary(out)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"], counts["deselected"]) == \
        (3, 1, 2, 1, 740)
    assert parse_summary("8 skipped, 744 deselected in 2.93s")["skipped"] == 8


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
