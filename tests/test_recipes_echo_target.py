"""hasten.recipes.echo.clock (the modelled slow source) and hasten.recipes.echo.target (the
echo sweep at a real target): the clock's arithmetic, AutoEcho's choice under a modelled
source of known R, the per-R expansion and statistics, and the sweep's resume."""

import dataclasses
import time

import numpy as np
import pytest

from hasten.echo import AutoEcho, EchoCounters
from hasten.recipes.echo.clock import ModelledClocks
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import fresh_keys, pipeline
from hasten.recipes.echo.sweep import train_budget
from hasten.recipes.echo.target import per_ratio, summarize_target, target_goals, target_table
from test_recipes_echo import _memory_data


# ----------------------------------------------------------------------------- The clock
def test_an_upstream_slower_than_the_steps_sets_the_pace():
    clocks = ModelledClocks([0.01], lead=4)
    for _ in range(100):
        clocks.take()
        clocks.advance(0.0)
    assert clocks.now[0] == pytest.approx(1.0) and clocks.waited[0] == pytest.approx(1.0)


def test_steps_slower_than_the_upstream_wait_only_for_the_first_example():
    clocks = ModelledClocks([0.001], lead=4)
    for _ in range(50):
        clocks.take()
        clocks.advance(0.01)
    assert clocks.waited[0] == pytest.approx(0.001)
    assert clocks.now[0] == pytest.approx(0.001 + 50 * 0.01) and clocks.stepped == pytest.approx(0.5)


def test_the_upstream_reads_at_most_lead_examples_ahead():
    """A consumer busy for 1 s finds only `lead` examples ready; each later one costs u again."""
    clocks = ModelledClocks([0.01], lead=4)
    clocks.advance(1.0)
    for _ in range(10):
        clocks.take()
    assert clocks.waited[0] == pytest.approx(6 * 0.01)
    # Without the bound all 10 would have been ready: a longer lead waits less.
    longer = ModelledClocks([0.01], lead=16)
    longer.advance(1.0)
    for _ in range(10):
        longer.take()
    assert longer.waited[0] == 0.0


def test_clocks_run_side_by_side_as_each_would_alone():
    together = ModelledClocks([0.002, 0.02], lead=8)
    alone = [ModelledClocks([u], lead=8) for u in (0.002, 0.02)]
    for i in range(40):
        for c in (together, *alone):
            c.take()
            if i % 8 == 7:
                c.advance(0.05)
    assert together.now == pytest.approx([alone[0].now[0], alone[1].now[0]])
    assert together.waited == pytest.approx([alone[0].waited[0], alone[1].waited[0]])


def test_a_stages_clock_includes_the_modelled_waits_and_items_takes_per_item():
    clocks = ModelledClocks([0.5], lead=2)
    assert list(clocks.items(iter("abc"))) == ["a", "b", "c"] and clocks.waited[0] == pytest.approx(1.5)
    assert clocks.time() - time.perf_counter() == pytest.approx(1.5, abs=0.01)


def test_clock_arguments_are_checked():
    for bad in ([], [0.0], [-1.0]):
        with pytest.raises(ValueError, match="per_example_s"):
            ModelledClocks(bad, lead=4)
    with pytest.raises(ValueError, match="lead"):
        ModelledClocks([0.01], lead=0)


# ----------------------------------------------------------------------------- AutoEcho under a modelled source
def _auto_factor(ratio: float, batches: int = 300, batch: int = 32, step_s: float = 0.01) -> AutoEcho:
    """Drive the sweep's pipeline with AutoEcho against a modelled upstream of ``ratio`` step
    times per batch; the step is modelled too (a fixed 10 ms), so only the clock decides."""
    auto = AutoEcho(e_max=8.0, interval=4 * batch)
    clocks = ModelledClocks([ratio * step_s / batch], lead=2 * batch)
    spec = RunSpec(echo="auto", seed=0)
    # The stage reads the modelled time alone (not the host's clock, as train_budget's does), so
    # the test does not depend on this machine's load: every second AutoEcho sees is modelled.
    batches_ = pipeline(clocks.items(fresh_keys(1000, 0, None, None)), spec, auto, 0, batch, EchoCounters(),
                        clock=lambda: clocks.now[0])
    for _ in range(batches):
        before = clocks.waited[0]
        keys, _, _ = next(batches_)
        clocks.advance(step_s)
        auto.record_step(clocks.waited[0] - before, step_s, len(keys))
    return auto


@pytest.mark.parametrize("ratio", [3.0, 6.0])
def test_autoecho_finds_the_modelled_ratio_without_being_told(ratio):
    auto = _auto_factor(ratio)
    # Its measurements of R (windows that waited) are R; the factor it uses moves around R:
    # e = R x (1 + headroom) after a measurement, probing a little lower while nothing waits.
    estimates = [r for _, r in auto.history if r == r]
    assert len(estimates) >= 3 and np.median(estimates) == pytest.approx(ratio, rel=0.1)
    used = [f for f, _ in auto.history[len(auto.history) // 2:]]
    assert np.mean(used) == pytest.approx(ratio, rel=0.2) and max(used) <= 1.25 * ratio


def test_autoecho_stays_off_when_the_modelled_source_keeps_up():
    auto = _auto_factor(0.5)
    assert auto.windows > 10 and auto.factor == 1.0 and all(f == 1.0 for f, _ in auto.history)


def test_train_budget_times_the_target_on_every_clock_and_autoecho_takes_one(one_thread):
    cfg = SweepConfig(data="x", train_images=512, test_images=200, batch_size=32, eval_points=(0.25, 0.5, 0.75, 1.0))
    data = _memory_data()
    clocks = ModelledClocks([0.002, 0.02], lead=64)
    r = train_budget(cfg, data, RunSpec(steps=40, lr=0.05), clocks=clocks, target=0.6)
    assert r["reached_target"]
    hit = next(point for point in r["curve"] if point[1] >= 0.6)
    assert r["clock_wall_to_target_s"] == hit[4] and hit[4][0] < hit[4][1]
    # The slow clock's wall time is its upstream's: 40 batches x 32 examples x 20 ms, less what was
    # read ahead of the last step; the measured steps (pipeline included) are on both clocks.
    assert r["clock_wall_s"][1] == pytest.approx(40 * 32 * 0.02, rel=0.05)
    assert r["clock_wall_s"][0] - r["clock_waited_s"][0] == pytest.approx(clocks.stepped)
    assert r["clock_wall_s"][1] - r["clock_waited_s"][1] == pytest.approx(clocks.stepped)
    with pytest.raises(ValueError, match="one clock"):
        train_budget(cfg, data, RunSpec(steps=4, echo="auto"), clocks=ModelledClocks([0.01, 0.02], lead=8))
    auto = train_budget(cfg, data, RunSpec(steps=40, echo="auto", lr=0.05), clocks=ModelledClocks([0.02], lead=64))
    assert auto["mean_echo_factor"] > 2  # R is about 0.64 s per batch over a step of milliseconds


def test_the_paper_sweeps_journal_settings_do_not_hold_the_target_sweeps_fields():
    from hasten.recipes.echo.sweep import journal_settings

    plain = journal_settings(SweepConfig(data="x"))
    assert not {"net_widths", "target", "lead_batches"} & set(plain)
    at = journal_settings(SweepConfig.at_target("x"))
    assert at["net_widths"] == (16, 32, 64) and at["target"] == 0.75 and at["lead_batches"] == 2


# ----------------------------------------------------------------------------- Statistics and goals
def _entry(ratio, e, seed, wall, fresh=1000, reached=True, mean_e=None):
    return {"nominal_ratio": ratio, "echo_factor": e, "seed": seed, "reached_target": reached, "lr": 0.1,
            "budget_steps": 10, "wall_time_to_target_s": wall if reached else None,
            "fresh_examples_to_target": fresh if reached else None, "steps_to_target": 5,
            "upstream_ratio": ratio, "idle_fraction": 0.5, "mean_echo_factor": mean_e or (e if e != "auto" else 3.0)}


def test_speedups_are_paired_by_seed_and_need_every_seed():
    entries = [_entry(4.0, 1.0, 0, 100.0), _entry(4.0, 1.0, 1, 200.0),
               _entry(4.0, 4.0, 0, 25.0), _entry(4.0, 4.0, 1, 100.0),
               _entry(4.0, 2.0, 0, 50.0), _entry(4.0, 2.0, 1, None, reached=False),
               _entry(4.0, "auto", 0, 40.0), _entry(4.0, "auto", 1, 80.0)]
    rows = {r["echo_factor"]: r for r in summarize_target(entries, [4.0], e_max=8.0)}
    assert rows["4.0"]["speedup"]["values"] == [4.0, 2.0] and rows["4.0"]["speedup"]["mean"] == 3.0
    # t(0.975, 1) = 12.706205 for two seeds: half-width 12.706205 x std / sqrt(2)
    assert rows["4.0"]["speedup"]["ci95"] == pytest.approx(12.706205 * np.std([4.0, 2.0], ddof=1) / 2 ** 0.5)
    assert rows["2.0"]["speedup"] is None and rows["2.0"]["reached"] == 1  # a missed seed: no mean speed-up
    assert rows["4.0"]["ideal_speedup"] == 4.0 and rows["2.0"]["ideal_speedup"] == 2.0
    assert rows["auto"]["ideal_speedup"] == 4.0  # min(e_max, R)
    goals = target_goals(list(rows.values()), [4.0])
    assert goals["e4_at_R4_speedup"] == 3.0 and goals["e4_at_R4_goal_met"]
    ratio = goals["per_ratio"][0]
    assert ratio["best_fixed_e"] == "4.0" and ratio["autoecho_speedup"] == pytest.approx(2.5)
    assert ratio["autoecho_vs_best"] == pytest.approx(2.5 / 3.0) and not ratio["autoecho_goal_met"]
    assert "| 4 (4.00 ± 0.00) | 4.0 | 2/2 |" in target_table(list(rows.values()))


def test_one_run_with_several_clocks_gives_one_entry_per_ratio():
    cfg = SweepConfig(data="x", batch_size=32)
    run = {"ratios": [2.0, 8.0], "clock_wall_s": [10.0, 40.0], "clock_waited_s": [5.0, 35.0],
           "clock_wall_to_target_s": [8.0, 30.0], "clock_per_example_s": [0.01, 0.04], "step_time_s": 0.16,
           "clock_lead": 64, "echo_factor": 2.0, "seed": 1, "curve": []}
    a, b = per_ratio(run, cfg)
    assert (a["group"], a["wall_time_to_target_s"], a["idle_fraction"]) == ("R=2", 8.0, 0.5)
    assert (b["group"], b["wall_time_to_target_s"], b["idle_fraction"]) == ("R=8", 30.0, 35.0 / 40.0)
    assert a["upstream_ratio"] == pytest.approx(0.01 * 32 / 0.16) and b["upstream_ratio"] == pytest.approx(8.0)
    assert not any(k.startswith("clock_") for k in a)


# ----------------------------------------------------------------------------- The sweep
def test_the_target_sweep_resumes_without_rerunning_finished_runs_and_times_every_ratio(
        tmp_path, monkeypatch, one_thread):
    from hasten.recipes.echo import target
    from hasten.rundir import RunJournal

    cfg = SweepConfig.at_target("x", train_images=512, test_images=200, image_size=16, net_widths=(4, 4, 4),
                                batch_size=32, epochs=1.0, seeds=2, lr_grid=(1.0,), target=0.6, lr=0.05,
                                eval_points=(0.5, 1.0), extra_budget=1.0)
    data = _memory_data()
    monkeypatch.setattr(target, "load_data", lambda cfg: data)
    real, trained, stop_after = target.train_budget, [], [4]

    def counted(cfg_, data_, spec, **kw):
        if kw.get("clocks") is not None:  # not current_step_time's probe
            if len(trained) == stop_after[0]:
                raise KeyboardInterrupt
            trained.append(spec)
        return real(cfg_, data_, spec, **kw)

    monkeypatch.setattr(target, "train_budget", counted)
    path = tmp_path / "runs.jsonl"
    with pytest.raises(KeyboardInterrupt):
        target.run_target(cfg, journal=RunJournal(path, dataclasses.asdict(cfg)))
    assert len(path.read_text().splitlines()) == 4
    first, stop_after[0] = len(trained), 10**6
    trained.clear()
    report = target.run_target(cfg, journal=RunJournal(path, dataclasses.asdict(cfg)))
    # tuning: e = 1, 2, 4 on seed 0; then seed 1 of those three and AutoEcho at R = 2, 4, 8 for both seeds;
    # then each run already at the target at its first evaluation again, evaluated from 20% of the budget.
    hits = [r for r in report["runs"] if r["reached_target"] and r["curve"][0][1] >= 0.6]
    assert len(report["runs"]) == 12 and 1 <= len(hits) and first + len(trained) == 12 + len(hits)
    assert report["journal"]["resumed"] == 4
    dense = [r for r in report["timed_runs"] if "dense_of" in r]
    assert len(dense) == len(hits)
    for r in dense:
        assert r["reached_target"]
        if r["echo_factor"] != "auto":  # the same training as the first run (AutoEcho's follows the time)
            assert r["curve"][0][0] == round(0.2 * r["budget_steps"])  # evaluated from 20% of the budget
            assert r["steps_to_target"] <= r["dense_of"]["steps_to_target"]
    fixed = [r for r in report["runs"] if r["echo_factor"] != "auto"]
    assert all(r["ratios"] == [2.0, 4.0, 8.0] for r in fixed)
    assert sorted(r["ratios"][0] for r in report["runs"] if r["echo_factor"] == "auto") == [2.0, 2.0, 4.0, 4.0,
                                                                                          8.0, 8.0]
    # One row per (R, e): the fixed settings' runs appear at every R.
    assert {(r["ratio"], r["echo_factor"]) for r in report["summary"]} == {
        (ratio, e) for ratio in (2.0, 4.0, 8.0) for e in ("1.0", "2.0", "4.0", "auto")}
    base = [r for r in report["runs"] if r["echo_factor"] == 1.0]
    assert all(r["final_accuracy"] is not None for r in base)  # the baseline goes the whole budget
    # The same clock's wall time grows with R for the same run.
    walls = base[0]["clock_wall_s"]
    assert walls[0] < walls[1] < walls[2]
    trained.clear()
    again = target.run_target(cfg, journal=RunJournal(path, dataclasses.asdict(cfg)))
    assert trained == [] and again["summary"] == report["summary"]
