"""hasten.recipes.echo (one run to a target) and hasten.recipes.echo_sweep (plans, statistics, report)."""

import dataclasses
import os

import pytest
import torch

from hasten.errors import ConfigError
from hasten.nn.tta import evaluate
from hasten.recipes.echo import MEAN, STD, EchoRunConfig, EvalSet, train_to_target
from hasten.recipes.echo_sweep import (EchoSweepConfig, comparison_jobs, format_table, run, stats, summarize,
                                       sweep_a_jobs, sweep_b_jobs, write_plots)
from hasten.stream.records import open_records


def test_echo_run_reaches_target_and_counts(colours, one_thread):
    eval_set = EvalSet(open_records(colours, "test"), 16, "cpu")
    base = train_to_target(EchoRunConfig(data=str(colours), echo=1.0, target=0.9), eval_set=eval_set)
    echoed = train_to_target(EchoRunConfig(data=str(colours), echo=3.0, target=0.9), eval_set=eval_set)
    for r in (base, echoed):
        assert r["reached_target"] and r["final_accuracy"] >= 0.85
        assert r["steps_to_target"] % 10 == 0  # evaluated every 10 steps
    # Echoing: ~3 items per fresh example (floor/ceil of 3 is exactly 3).
    assert echoed["steps_to_target"] * 64 >= 2.5 * echoed["fresh_examples_to_target"] - 64 * 5
    assert base["fresh_examples_to_target"] >= base["steps_to_target"] * 64 - 64


def test_eval_set_normalises_and_evaluates_through_the_one_evaluator(colours):
    eval_set = EvalSet(open_records(colours, "test"), 16, "cpu")
    batches = list(eval_set.batches())
    x, y = batches[0]
    assert len(y) == 48 and sum(len(b[1]) for b in eval_set.batches(10)) == 10
    first = eval_set.images[eval_set.order[0]].float() / 255
    expected = (first - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    assert torch.allclose(x[0], expected, atol=1e-5)

    class Colour(torch.nn.Module):  # class 0 (blue, folders sort) when blue outweighs red
        def forward(self, images):
            return images[:, [2, 0]].mean((2, 3))

    assert evaluate(Colour(), eval_set.batches()) == 1.0


def test_config_is_frozen_resolved_and_validated():
    cpu = EchoRunConfig.for_device("cpu", data="x")
    gpu = EchoRunConfig.for_device("cuda", data="x", target=0.9)
    assert cpu == EchoRunConfig(data="x") and cpu.batch_size == 64 and cpu.width == 16
    assert (gpu.batch_size, gpu.width, gpu.image_size, gpu.target, gpu.device) == (512, 0, 32, 0.9, "cuda")
    assert EchoRunConfig(data="x", echo="AUTO").echo == "auto" and EchoRunConfig(data="x", echo="2").echo == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.target = 0.5
    for bad, match in [({"echo": 0.5}, ">= 1"), ({"variant": "sideways"}, "accepted"),
                       ({"target": 1.5}, "target"), ({"upstream_delay_s": -1.0}, "delay")]:
        with pytest.raises(ConfigError, match=match):
            EchoRunConfig(data="x", **bad)
    with pytest.raises(ConfigError, match="repeats"):
        EchoSweepConfig(cpu, repeats=0)


def test_stats_on_known_inputs():
    assert stats([1.0, 2.0, 3.0, None]) == {"mean": 2.0, "std": 1.0, "n": 3}  # sample std, None skipped
    assert stats([5.0]) == {"mean": 5.0, "std": 0.0, "n": 1}
    assert stats([None, None]) == {"mean": None, "std": None, "n": 0}


def _entry(group, echo, wall, fresh, variant="batch", seed=0):
    return {"group": group, "variant": variant, "echo_factor": echo, "reached_target": wall is not None,
            "storage_ratio": 1, "fresh_examples_to_target": fresh, "steps_to_target": 10,
            "wall_time_to_target_s": wall, "final_accuracy": 0.5, "idle_fraction": 0.1, "upstream_ratio": 4.0,
            "mean_echo_factor": echo if echo != "auto" else 3.0, "seed": seed}


def test_summary_speedup_is_relative_to_same_group():
    rows = summarize([_entry("R=4", 1.0, 8.0, 100), _entry("R=4", 4.0, 2.0, 50), _entry("R=2", 1.0, 4.0, 100),
                      _entry("R=2", 4.0, 4.0, 50)])
    speed = {(r["group"], r["echo_factor"]): r["speedup"] for r in rows}
    assert speed[("R=4", "4.0")] == pytest.approx(4.0) and speed[("R=2", "4.0")] == pytest.approx(1.0)
    assert "4.00x" in format_table(rows)


def test_summary_pools_seeds_and_treats_no_echo_as_one_configuration():
    rows = summarize([_entry("a", 1.0, 10.0, 100, "batch"), _entry("a", 1.0, 14.0, 140, "example-after", seed=1),
                      _entry("a", 2.0, 6.0, 150), _entry("a", 2.0, None, None, seed=1),
                      _entry("a", "auto", 8.0, 120)])
    assert [(r["variant"], r["echo_factor"], r["n"], r["reached"]) for r in rows] == [
        ("none", "1.0", 2, 2), ("batch", "2.0", 2, 1), ("batch", "auto", 1, 1)]
    none, e2, auto = rows
    assert none["wall_time_to_target_s"] == {"mean": 12.0, "std": pytest.approx(2 ** 0.5 * 2), "n": 2}
    assert e2["speedup"] == pytest.approx(2.0) and e2["fresh_ratio"] == pytest.approx(1.25)
    assert auto["speedup"] == pytest.approx(1.5)
    table = format_table(rows)
    assert "12.0±2.8" in table and "a3.0" in table  # spread over seeds; AutoEcho's mean factor


def test_sweep_plots_are_written(tmp_path):
    rows = summarize([_entry("a", 1.0, 10.0, 100), _entry("a", 2.0, 8.0, 150), _entry("R=2", 1.0, 8.0, 100),
                      _entry("R=2", 2.0, 4.0, 150), _entry("R=2", "auto", 5.0, 140)])
    paths = write_plots(rows, tmp_path / "plots")
    assert [os.path.basename(p) for p in paths] == ["echo_fresh_examples.png", "echo_speedup.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_sweep_plan_covers_the_papers_two_findings():
    base = EchoRunConfig(data="x")
    a = sweep_a_jobs(base)
    assert {(j.config.variant, j.config.echo) for j in a[1:]} == {
        (v, e) for v in ("example-before", "example-after", "batch") for e in (2.0, 4.0, 6.0)}
    assert all(j.config.upstream_delay_s == 0 for j in a)
    b = sweep_b_jobs(base, step_s=0.064)  # batch 64: 1 ms per example = R 1
    delays = {j.group: j.config.upstream_delay_s for j in b}
    assert delays == pytest.approx({"R=2": 0.002, "R=4": 0.004, "R=6": 0.006, "R<1": 0.0})
    assert {j.config.echo for j in b if j.group == "R=6"} == {1.0, 2.0, 4.0, 6.0, "auto"}


def test_comparison_sets_the_delay_from_the_ratio_or_keeps_it():
    base = EchoRunConfig(data="x", echo=3.0, upstream_delay_s=0.01)
    jobs = comparison_jobs(base, step_s=0.064, upstream_ratio=4.0)
    assert [j.config.echo for j in jobs] == [1.0, 3.0]
    assert [j.config.upstream_delay_s for j in jobs] == pytest.approx([0.004, 0.004])
    assert {j.group for j in jobs} == {"delay=4.000ms"}
    kept = comparison_jobs(dataclasses.replace(base, echo=1.0), step_s=0.064, upstream_ratio=None)
    assert len(kept) == 1 and kept[0].config.upstream_delay_s == 0.01


def test_run_reports_every_run_and_its_summary(colours, one_thread):
    events = []
    base = EchoRunConfig(data=str(colours), echo=2.0, target=0.9, upstream_delay_s=0.0002)
    report = run(EchoSweepConfig(base, repeats=2, upstream_ratio=None), log=lambda **r: events.append(r))
    assert [(e["echo_factor"], e["seed"]) for e in report["results"]] == [(1.0, 0), (2.0, 0), (1.0, 1), (2.0, 1)]
    assert len(report["baseline"]) == 2 and report["step_time_s"] > 0 and report["repeats"] == 2
    assert [(r["echo_factor"], r["n"]) for r in report["summary"]] == [("1.0", 2), ("2.0", 2)]
    # An echoed run reports the R measured by the run without echoing of its seed.
    assert report["results"][1]["upstream_ratio"] == report["results"][0]["upstream_ratio"] >= 1
    assert report["config"]["base"]["upstream_delay_s"] == 0.0002
    kinds = [e.get("event") for e in events]
    assert kinds.count("run") == 4 and kinds.count("step_time") == 1
    assert all(e["group"] == "delay=0.200ms" for e in events if "accuracy" in e)
