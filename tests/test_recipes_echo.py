"""hasten.recipes.echo: run (one run to a target), sweep with its config and data (the paper-regime
sweep), compare (the comparison) and report (statistics, tables, goals)."""

import dataclasses
import os
import time

import numpy as np
import pytest
import torch

from hasten.echo import EchoCounters
from hasten.errors import ConfigError
from hasten.nn.tta import evaluate
from hasten.recipes.echo import MEAN, STD, EchoRunConfig, EvalSet, train_to_target
from hasten.recipes.echo.compare import ComparisonConfig, compare, comparison_jobs
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import MemoryData, Source, balanced_subset, pipeline
from hasten.recipes.echo.report import format_table, goals, summarize, write_plots
from hasten.recipes.echo.sweep import best_loader, lr_at, train_budget


def test_echo_run_reaches_target_and_counts(colours, one_thread):
    eval_set = EvalSet.of(str(colours), 16, "cpu")
    base = train_to_target(EchoRunConfig(data=str(colours), echo=1.0, target=0.9), eval_set=eval_set)
    echoed = train_to_target(EchoRunConfig(data=str(colours), echo=3.0, target=0.9), eval_set=eval_set)
    for r in (base, echoed):
        assert r["reached_target"] and r["final_accuracy"] >= 0.85
        assert r["steps_to_target"] % 10 == 0  # evaluated every 10 steps
    # Echoing: ~3 items per fresh example (floor/ceil of 3 is exactly 3).
    assert echoed["steps_to_target"] * 64 >= 2.5 * echoed["fresh_examples_to_target"] - 64 * 5
    assert base["fresh_examples_to_target"] >= base["steps_to_target"] * 64 - 64


def test_autoecho_in_a_run_measures_what_a_repeat_is_worth_on_the_task(colours, one_thread):
    """hasten echo's AutoEcho takes the repeat value from the run's own gradients. The
    storage makes the run input-bound by construction: a batch of 32 takes 0.16 s to read,
    a step on 16x16 images a few milliseconds, so AutoEcho echoes at e_max = 2, and each
    batch holds the 8 first copies and 4 repeats a measurement needs; 1,920 fresh examples
    give the 12 reports (3 blocks) before the measurement moves the schedule."""
    cfg = EchoRunConfig(data=str(colours), echo="auto", batch_size=32, upstream_delay_s=0.005, target=0.999,
                        max_fresh=1920, eval_every=1000, value_every=2, e_max=2.0)
    r = train_to_target(cfg, eval_set=EvalSet.of(str(colours), 16, "cpu"))
    assert r["mean_echo_factor"] > 1.5
    assert r["repeat_value_measured"], r  # from 3 blocks of 4 reports on, a value per block
    assert all(0.05 <= v <= 1.0 for v in r["repeat_value_measured"])
    off = train_to_target(dataclasses.replace(cfg, value_every=0, max_fresh=160),
                          eval_set=EvalSet.of(str(colours), 16, "cpu"))
    assert off["repeat_value_measured"] == []  # 0: AutoEcho's constant


def test_eval_set_normalises_and_evaluates_through_the_one_evaluator(colours):
    eval_set = EvalSet.of(str(colours), 16, "cpu")
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
                       ({"target": 1.5}, "target"), ({"upstream_delay_s": -1.0}, "delay"),
                       ({"value_every": -1}, "value_every"), ({"value_every": 2.5}, "value_every")]:
        with pytest.raises(ConfigError, match=match):
            EchoRunConfig(data="x", **bad)
    with pytest.raises(ConfigError, match="repeats"):
        ComparisonConfig(cpu, repeats=0)
    with pytest.raises(ConfigError, match="seeds"):
        SweepConfig(data="x", seeds=0)


def _entry(group, echo, wall, fresh, variant="example-before", seed=0):
    return {"group": group, "variant": variant, "echo_factor": echo, "reached_target": wall is not None,
            "fresh_examples_to_target": fresh, "steps_to_target": 10, "wall_time_to_target_s": wall,
            "end_accuracy": 0.5, "final_accuracy": 0.5, "idle_fraction": 0.1, "upstream_ratio": 4.0,
            "mean_echo_factor": echo if echo != "auto" else 3.0, "seed": seed, "lr": 0.1, "budget_steps": 100,
            "shuffle_buffer": 0, "duplicate_rate": 0.0, "step_time_s": 0.01}


def test_summary_speedup_is_relative_to_same_group_and_needs_every_seed():
    rows = summarize([_entry("R=4", 1.0, 8.0, 100), _entry("R=4", 4.0, 2.0, 50), _entry("R=2", 1.0, 4.0, 100),
                      _entry("R=2", 4.0, 4.0, 50), _entry("R=2", 2.0, 2.0, 50), _entry("R=2", 2.0, None, None, seed=1)])
    speed = {(r["group"], r["echo_factor"]): r["speedup"] for r in rows}
    assert speed[("R=4", "4.0")] == pytest.approx(4.0) and speed[("R=2", "4.0")] == pytest.approx(1.0)
    assert speed[("R=2", "2.0")] is None  # one seed missed the target: no mean time to compare
    assert "4.00x" in format_table(rows)


def test_summary_pools_seeds_and_treats_no_echo_as_one_configuration():
    rows = summarize([_entry("a", 1.0, 10.0, 100, "batch"), _entry("a", 1.0, 14.0, 140, "example-after", seed=1),
                      _entry("a", 2.0, 6.0, 150, "batch"), _entry("a", "auto", 8.0, 120, "batch")])
    assert [(r["variant"], r["echo_factor"], r["n"]) for r in rows] == [
        ("none", "1.0", 2), ("batch", "2.0", 1), ("batch", "auto", 1)]
    none, e2, auto = rows
    assert none["wall_time_to_target_s"] == {"mean": 12.0, "std": pytest.approx(2 ** 0.5 * 2), "n": 2}
    assert e2["speedup"] == pytest.approx(2.0) and e2["fresh_ratio"] == pytest.approx(1.25)
    assert auto["speedup"] == pytest.approx(1.5)
    table = format_table(rows)
    assert "12.0±2.8" in table and "a3.0" in table  # spread over seeds; AutoEcho's mean factor


def test_goals_compare_autoecho_with_the_best_fixed_factor():
    rows = summarize([_entry("R=6", 1.0, 12.0, 100), _entry("R=6", 4.0, 4.0, 50), _entry("R=6", 6.0, 3.0, 40),
                      _entry("R=6", "auto", 3.3, 45), _entry("R<1", 1.0, 2.0, 100), _entry("R<1", "auto", 2.02, 100)])
    g = goals(rows, (6.0,))
    (r6,) = g["per_ratio"]
    assert r6["best_fixed_e"] == "6.0" and r6["best_fixed_speedup"] == pytest.approx(4.0)
    assert r6["autoecho_vs_best"] == pytest.approx(3.0 / 3.3)
    assert g["not_input_bound_autoecho_slowdown"] == pytest.approx(0.01)
    # Final accuracy at the full budget: within the spread = not below the baseline's mean - std.
    low = dict(_entry("a", 4.0, None, None), final_accuracy=0.40)
    rows = summarize([dict(_entry("a", 1.0, None, None), final_accuracy=0.50),
                      dict(_entry("a", 1.0, None, None, seed=1), final_accuracy=0.52), low,
                      dict(_entry("a", 2.0, None, None), final_accuracy=0.497)])
    within = {r["echo_factor"]: r["within_spread"] for r in goals(rows, ())["final_accuracy"]}
    assert within == {"4.0": False, "2.0": True}
    # One baseline seed has no spread (std None): "within it" is not decided either way.
    rows = summarize([dict(_entry("a", 1.0, None, None), final_accuracy=0.50), low])
    assert [r["within_spread"] for r in goals(rows, ())["final_accuracy"]] == [None]


def test_sweep_plots_are_written(tmp_path):
    rows = summarize([_entry("a", 1.0, 10.0, 100), _entry("a", 2.0, 8.0, 150), _entry("R=2", 1.0, 8.0, 100),
                      _entry("R=2", 2.0, 4.0, 150), _entry("R=2", "auto", 5.0, 140)])
    paths = write_plots(rows, tmp_path / "plots")
    assert [os.path.basename(p) for p in paths] == ["echo_fresh_examples.png", "echo_speedup.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_schedule_warms_up_then_decays_linearly_to_zero():
    steps, peak = 100, 0.2
    lrs = [lr_at(t, steps, peak, 0.05) for t in range(steps)]
    assert lrs[:5] == pytest.approx([peak * (t + 1) / 5 for t in range(5)])  # warm-up over 5 steps
    assert lrs[5:] == pytest.approx([peak * (steps - t) / 95 for t in range(5, steps)])
    assert max(lrs) == pytest.approx(peak) and lr_at(steps, steps, peak, 0.05) == 0.0


def test_balanced_subset_is_fixed_and_balanced():
    labels = np.repeat(np.arange(10), 50)
    a, b = balanced_subset(labels, 203), balanced_subset(labels, 203)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 203
    counts = np.bincount(labels[a], minlength=10)
    assert counts.max() - counts.min() <= 1


def _spec(**kw):
    return RunSpec(**{"steps": 10, "lr": 0.1, **kw})


def test_pipeline_variants_number_and_repeat_copies():
    c = EchoCounters()
    before = list(pipeline(iter(range(64)), _spec(echo=2.0), 2.0, 0, 16, c))
    keys = np.concatenate([b[0] for b in before])
    copies = np.concatenate([b[1] for b in before])
    assert keys.tolist() == [k for k in range(64) for _ in range(2)] and copies.tolist() == [0, 1] * 64
    assert c.fresh_examples == 64
    assert np.concatenate([b[2] for b in before]).tolist() == [0, 1] * 64  # copy numbers
    after = list(pipeline(iter(range(64)), _spec(echo=2.0, variant="example-after"), 2.0, 0, 16, EchoCounters()))
    assert not np.concatenate([b[1] for b in after]).any()  # identical copies: one augmentation key
    assert np.concatenate([b[2] for b in after]).tolist() == [0, 1] * 64  # ... but still numbered
    c = EchoCounters()
    batches = list(pipeline(iter(range(64)), _spec(echo=3.0, variant="batch"), 3.0, 0, 16, c))
    assert len(batches) == 12 and c.fresh_batches == 4
    assert all(np.array_equal(batches[i][0], batches[i + 1][0]) for i in (0, 1, 3, 4))
    # A shuffle buffer spreads the copies: fewer duplicates inside a batch.
    c = EchoCounters()
    for k, _, _ in pipeline(iter(range(4000)), _spec(echo=4.0), 4.0, 2000, 16, c):
        c.record_batch(k.tolist())
    assert c.duplicate_rate < 0.05


def _memory_data(n=512, m=200, seed=0):
    """Two classes a small net separates: reddish and bluish noise (as the colours fixture)."""
    rng = np.random.default_rng(seed)

    def images(k):
        labels = rng.integers(0, 2, k)
        x = rng.integers(0, 120, (k, 16, 16, 3), dtype=np.uint8)
        x[labels == 0, :, :, 0] += 120
        x[labels == 1, :, :, 2] += 120
        return x, labels.astype(np.int64)

    train, train_labels = images(n)
    test, test_labels = images(m)
    return MemoryData(train=train, train_labels=train_labels, wire_bytes=np.full(n, 900),
                      test=torch.from_numpy(test).permute(0, 3, 1, 2).contiguous(),
                      test_labels=torch.from_numpy(test_labels), eval_order=torch.randperm(m), classes=["r", "b"])


def _sweep_cfg(**kw):
    return SweepConfig(data="x", train_images=512, test_images=200, batch_size=32, **kw)


def test_train_budget_learns_and_the_slow_source_changes_timing_not_math(one_thread):
    cfg, data = _sweep_cfg(), _memory_data()
    spec = _spec(steps=30, echo=2.0)
    plain = train_budget(cfg, data, spec, target=0.9)
    source = Source(latency_s=0.002, link_bytes_per_s=1e9, request_examples=32, in_flight=4)
    slow = train_budget(cfg, data, spec, source=source, target=0.9)
    assert plain["final_accuracy"] >= 0.9 and plain["reached_target"] and plain["steps"] == 30
    assert [c[:3] for c in plain["curve"]] == [c[:3] for c in slow["curve"]]  # same steps, accuracy, fresh
    # e = 2: each fresh example gives two items; the steps took 30 x 32 of them and the shuffle
    # buffer (default size for e = 2, batch 32: 800) holds the rest of what was read.
    assert plain["shuffle_buffer"] == 800
    assert plain["fresh_examples"] == pytest.approx((30 * 32 + 800) / 2, abs=1)
    assert plain["wall_time_to_target_s"] is None and slow["wall_time_to_target_s"] > 0


def test_measured_ratio_follows_the_links_bandwidth(one_thread):
    cfg, data = _sweep_cfg(eval_points=(1.0,)), _memory_data()
    # 32 examples x 900 bytes at 72 kB/s: 0.4 s per batch, one request at a time (no read while the
    # step runs), far above a step on 16x16 images even beside other jobs: a step there takes
    # milliseconds, and the asserts allow up to 0.4 s. The step's time is wall time: beside two busy
    # processes it took about 0.14 s, and with 4 requests in flight at 0.2 s a batch (the reads went
    # on during the step) it read R = 1.45.
    source = Source(latency_s=0.01, link_bytes_per_s=72_000, request_examples=32, in_flight=1)
    t0 = time.perf_counter()
    r = train_budget(cfg, data, _spec(steps=6), source=source)
    assert r["upstream_ratio"] > 2 and r["idle_fraction"] > 0.5
    assert time.perf_counter() - t0 >= 6 * 0.4 - 0.05
    echoed = train_budget(cfg, data, _spec(steps=6, echo=4.0, shuffle_buffer=0), source=source)
    # A quarter of the reads: seconds waited for input, not the wall time, which a slow step
    # beside other jobs would make up for both runs alike.
    waited = [run["idle_fraction"] * run["wall_time_s"] for run in (r, echoed)]
    assert waited[1] < 0.6 * waited[0]


def test_best_loader_finds_enough_requests_in_flight_to_hide_latency():
    # Wall time, so the gap must dwarf another job's burst: 16 batches at 50 ms of latency are 0.8 s one
    # request at a time against about 0.1 s eight at once. Four batches at 30 ms (0.12 s against 0.03 s)
    # picked one in flight in 3 runs of 8 beside two busy processes: one late wake-up of the eight's run.
    cfg, data = _sweep_cfg(in_flight_grid=(1, 8), prefetch_grid=(0,), latency_s=0.05), _memory_data()
    chosen, trials = best_loader(cfg, data, Source(0.05, 1e9, 32), step_s=0.001, batches=16)
    assert chosen.in_flight == 8 and len(trials) == 2
    one = next(t for t in trials if t["in_flight"] == 1)
    assert one["s_per_batch"] >= 0.05  # one 32-example request per batch, each paying the latency


def test_comparison_sets_the_delay_from_the_ratio_or_keeps_it():
    base = EchoRunConfig(data="x", echo=3.0, upstream_delay_s=0.01)
    jobs = comparison_jobs(base, step_s=0.064, upstream_ratio=4.0)
    assert [j.echo for _, j in jobs] == [1.0, 3.0]
    assert [j.upstream_delay_s for _, j in jobs] == pytest.approx([0.004, 0.004])
    assert {g for g, _ in jobs} == {"delay=4.000ms"}
    kept = comparison_jobs(dataclasses.replace(base, echo=1.0), step_s=0.064, upstream_ratio=None)
    assert len(kept) == 1 and kept[0][1].upstream_delay_s == 0.01


def test_compare_reports_every_run_and_its_summary(colours, one_thread):
    events = []
    base = EchoRunConfig(data=str(colours), echo=2.0, target=0.9, upstream_delay_s=0.0002)
    report = compare(ComparisonConfig(base, repeats=2, upstream_ratio=None), log=lambda **r: events.append(r))
    assert sorted((e["echo_factor"], e["seed"]) for e in report["results"]) == [(1.0, 0), (1.0, 1), (2.0, 0),
                                                                                 (2.0, 1)]
    assert len(report["baseline"]) == 2 and report["step_time_s"] > 0 and report["repeats"] == 2
    assert sorted((r["echo_factor"], r["n"]) for r in report["summary"]) == [("1.0", 2), ("2.0", 2)]
    for e in report["results"]:  # an echoed run reports the R measured without echoing, same seed
        base_run = next(b for b in report["baseline"] if b["seed"] == e["seed"])
        assert e["upstream_ratio"] == base_run["upstream_ratio"]
    kinds = [e.get("event") for e in events]
    assert kinds.count("run") == 4 and kinds.count("step_time") == 1


def test_default_shuffle_buffer_follows_e_and_a_small_one_warns():
    from hasten.recipes.echo import shuffle_size

    assert shuffle_size(EchoRunConfig(data="x", echo=5.0)) == 6400
    # AutoEcho: the loader sizes the buffer for the current e (one sized for e_max read as R 541)
    assert shuffle_size(EchoRunConfig(data="x", echo="auto", e_max=8.0)) is None
    assert shuffle_size(EchoRunConfig(data="x", echo="auto", shuffle_buffer=12_000)) == 12_000
    assert shuffle_size(EchoRunConfig(data="x", echo=1.0)) == 0
    with pytest.warns(UserWarning, match="repeated copies"):
        assert shuffle_size(EchoRunConfig(data="x", echo=5.0, shuffle_buffer=256)) == 256


def test_cuda_runs_channels_last_under_bf16_and_the_cpu_stays_float32_nchw():
    from hasten.recipes.echo import fast_formats

    assert fast_formats(torch.device("cuda", 0)) == (torch.channels_last, True)
    assert fast_formats("cuda") == (torch.channels_last, True)
    assert fast_formats("cpu") == (torch.contiguous_format, False)


def test_step_time_leaves_out_first_use_costs(colours, one_thread, monkeypatch):
    # The first steps of a fresh process pay cuDNN autotuning and allocator growth; a step time
    # that includes them sets a slower step, hence a longer storage delay and a larger R.
    import hasten.recipes.loop as loop
    from hasten.recipes.echo import measure_step_time

    real_step = loop.optimizer_step
    calls = []

    def first_calls_slow(loss, opt, scheduler=None, **hooks):
        calls.append(1)
        if len(calls) <= 3:
            time.sleep(1.0)
        real_step(loss, opt, scheduler, **hooks)

    monkeypatch.setattr(loop, "optimizer_step", first_calls_slow)
    eval_set = EvalSet.of(str(colours), 16, "cpu")
    step = measure_step_time(EchoRunConfig(data=str(colours)), steps=6, warmup=3, eval_set=eval_set)
    assert len(calls) == 9
    assert step < 0.25  # >= 3 x 1 s / 6 = 0.5 s if the slow first steps counted


def test_a_stopped_sweep_resumes_from_its_journal_without_rerunning_finished_runs(tmp_path, monkeypatch, one_thread):
    """benchmarks/echo_sweep.py and hasten echo --sweep: stop the sweep part way (a crash
    in its eighth training run), run it again with the same journal: the finished runs are taken
    from the journal, only the rest are trained, and the report has every run."""
    from hasten.recipes.echo import sweep
    from hasten.rundir import RunJournal

    cfg = _sweep_cfg(epochs=0.75, seeds=2, lr_grid=(1.0,), factors=(2.0,), other_factors=(), ratios=(2.0,),
                     buffer_sizes=(), in_flight_grid=(1,), prefetch_grid=(0,), latency_s=0.001,
                     eval_points=(0.5, 1.0), extra_budget=1.0)
    data = _memory_data()
    monkeypatch.setattr(sweep, "load_data", lambda cfg: data)
    real, trained, stop_after = sweep.train_budget, [], [7]

    def counted(cfg_, data_, spec, **kw):
        if kw.get("final_eval", True):  # not current_step_time's probe
            if len(trained) == stop_after[0]:
                raise KeyboardInterrupt
            trained.append(spec)
        return real(cfg_, data_, spec, **kw)

    monkeypatch.setattr(sweep, "train_budget", counted)
    path = tmp_path / "runs.jsonl"
    with pytest.raises(KeyboardInterrupt):
        sweep.run(cfg, journal=RunJournal(path, dataclasses.asdict(cfg)))
    assert len(trained) == 7 and len(path.read_text().splitlines()) >= 7  # runs and loader searches
    first_part, stop_after[0] = list(trained), 10**6
    trained.clear()
    journal = RunJournal(path, dataclasses.asdict(cfg))
    report = sweep.run(cfg, journal=journal)
    # 2 baseline + 2 echo (tune + seed 1) + 1 buffer + 2 seeds x 5 timed (R=2: e 1, 2, auto; R<1: e 1, auto)
    assert len(first_part) + len(trained) == 15 and len(report["results"]) == 15
    assert journal.resumed >= 7 and report["journal"]["resumed"] == journal.resumed
    # A third run finds everything done: nothing is trained and the report is the same.
    trained.clear()
    again = sweep.run(cfg, journal=RunJournal(path, dataclasses.asdict(cfg)))
    assert trained == [] and again["target"] == report["target"]
    assert [r["end_accuracy"] for r in again["results"]] == [r["end_accuracy"] for r in report["results"]]


@pytest.mark.parametrize("per_example_s", [0.01, 1e-7])
def test_autoecho_in_the_sweep_runs_the_budgets_schedule_in_steps(one_thread, monkeypatch, per_example_s):
    """Issue 44: AutoEcho's schedule is the budget in steps, as a fixed factor's. Repeats
    measured at 0.65 of a fresh example at e = 4 stretched it by 1 / (1/4 + 3/4 x 0.65) =
    1.36x (the old effective-example budget); now the run ends at the budget's steps and its
    learning rate follows lr_at of the step. With an upstream faster than the step (R < 1) e
    stays 1 and nothing is measured."""
    from hasten.recipes.echo import loop_hooks
    from hasten.recipes.echo.clock import ModelledClocks

    monkeypatch.setattr(loop_hooks, "gradient_dots", lambda *a, **k: (0.65, 1.0))  # each report: v = 0.65
    lrs = []
    sgd_step = torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: (lrs.append(self.param_groups[0]["lr"]),
                                                                        sgd_step(self, *a, **k))[1])
    cfg = SweepConfig(data="x", train_images=1024, test_images=200, batch_size=64, value_every=1,
                      eval_points=(0.5, 1.0))
    spec = _spec(steps=60, echo="auto", e_max=4.0)
    # 10 ms per example, 0.64 s a batch, against a step of milliseconds: R far above e_max = 4;
    # 0.1 us per example: R far below 1.
    r = train_budget(cfg, _memory_data(n=1024), spec, clocks=ModelledClocks([per_example_s], lead=128))
    assert r["steps"] == spec.steps and [c[0] for c in r["curve"]] == [30, 60]
    assert lrs == pytest.approx([lr_at(s, spec.steps, spec.lr, cfg.warmup) for s in range(spec.steps)])
    if per_example_s > 1e-3:
        assert r["autoecho_windows"][-1][0] == 4.0 and r["mean_echo_factor"] > 2.5
        assert r["repeat_value_measured"][-1] == pytest.approx(0.65, abs=0.01)
    else:
        assert r["mean_echo_factor"] == 1.0 and r["repeat_value_measured"] == []
        assert r["fresh_examples"] == spec.steps * cfg.batch_size  # every item fresh


@pytest.mark.parametrize("every", [0, 2])
def test_autoecho_in_the_sweep_measures_the_repeat_value_only_when_asked(one_thread, every):
    from hasten.echo.auto import REPEAT_VALUE
    from hasten.recipes.echo.clock import ModelledClocks

    cfg = SweepConfig(data="x", train_images=1024, test_images=200, batch_size=64, value_every=every,
                      eval_points=(1.0,))
    # A modelled upstream (no sleeping) of 10 ms per example, 0.64 s a batch, against a step of a
    # few ms, or 100 ms on a loaded machine: AutoEcho echoes at its e_max of 3 whatever the load,
    # so every batch holds first copies and repeats.
    r = train_budget(cfg, _memory_data(n=1024), _spec(steps=60, echo="auto", e_max=3.0),
                     clocks=ModelledClocks([0.01], lead=128))
    assert r["mean_echo_factor"] > 1.5
    values = r["repeat_value_measured"]
    if every == 0:
        assert values == []
    else:
        assert values and all(0.05 <= v <= 1.0 for v in values)
        assert values[-1] != REPEAT_VALUE  # the run's own measurement, not the constant
