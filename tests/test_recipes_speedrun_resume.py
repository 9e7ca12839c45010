"""A stopped speedrun resumed: the run continued from its last epoch end ends with the
weights and accuracy of one never stopped (bit for bit on the CPU), the job keeps its
finished runs, logs each epoch once, and times a resumed run as before the stop + after."""

import json

import pytest
import torch
from speedrun_helpers import SMALL, TINY_DATA

import hasten.recipes.speedrun as speedrun
import hasten.recipes.speedrun_train as speedrun_train
from hasten.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from hasten.data.normalize import channel_stats
from hasten.errors import ConfigError
from hasten.recipes.speedrun import JobCheckpoint, SpeedrunConfig, ladder_recipes, plan_resume, run, train_run
from hasten.rundir import RunDir

MEAN_STD = channel_stats(TINY_DATA.train.images)
CPU = torch.device("cpu")


@pytest.fixture
def evaluated(monkeypatch):
    """The weights of every evaluation, in order: the last one of a run is its final evaluation's."""
    seen = []
    evaluate = speedrun_train.evaluate

    def recording(model, batches, level="none", **kwargs):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return evaluate(model, batches, level, **kwargs)

    monkeypatch.setattr(speedrun_train, "evaluate", recording)
    return seen


@pytest.mark.parametrize("recipe", [
    SMALL.replace(epochs=4),                                   # Lookahead, whitening, device loader
    SMALL.replace(epochs=4, averaging="ema", tta="flip"),      # EMA evaluated on a copy
    ladder_recipes(SMALL.replace(epochs=4))[0][1],             # host loader, no whitening, no average
], ids=["lookahead", "ema", "baseline-rung"])
def test_a_run_resumed_after_epoch_2_ends_as_one_never_stopped(recipe, evaluated, tmp_path):
    path = tmp_path / "checkpoint.pt"

    def keep_epoch_2(state):
        if state["epoch"] == 2:
            save_checkpoint(path, state)  # through the file: what a new process would read

    whole = train_run(recipe, TINY_DATA, CPU, mean_std=MEAN_STD, seed=5, on_checkpoint=keep_epoch_2)
    uninterrupted = evaluated[-1]
    state = load_checkpoint(path)
    resumed = train_run(recipe, TINY_DATA, CPU, mean_std=MEAN_STD, seed=5, resume=state)
    continued = evaluated[-1]
    assert uninterrupted.keys() == continued.keys()
    assert all(torch.equal(uninterrupted[k], continued[k]) for k in uninterrupted)  # the CPU path is deterministic
    assert (resumed.accuracy, resumed.tta_accuracy) == (whole.accuracy, whole.tta_accuracy)
    # Every epoch's training loss and accuracy is the same float: the same batches, the same steps.
    keys = ("epoch", "step", "train_loss", "train_accuracy", "val_accuracy", "tta_accuracy")
    assert [{k: e[k] for k in keys} for e in resumed.epochs] == [{k: e[k] for k in keys} for e in whole.epochs]
    # Its time: the seconds up to the checkpoint, then the seconds after the resume.
    assert len(whole.time_parts_s) == 1 and whole.time_parts_s[0] == whole.time_s
    before, after = resumed.time_parts_s
    assert before == state["time_s"] > 0 and after > 0 and resumed.time_s == pytest.approx(before + after)


def test_a_resume_without_the_optimizer_state_would_differ(evaluated, tmp_path):
    """The comparison above can fail: momentum left out of the state changes the weights."""
    recipe = SMALL.replace(epochs=4)
    train_run(recipe, TINY_DATA, CPU, mean_std=MEAN_STD, seed=5,
              on_checkpoint=lambda s: save_checkpoint(tmp_path / "c.pt", s) if s["epoch"] == 2 else None)
    a = evaluated[-1]
    state = load_checkpoint(tmp_path / "c.pt")
    for group in state["optimizer"]["state"].values():
        group["momentum_buffer"].zero_()
    train_run(recipe, TINY_DATA, CPU, mean_std=MEAN_STD, seed=5, resume=state)
    b = evaluated[-1]
    assert not all(torch.equal(a[k], b[k]) for k in a)


class Stop:
    """Ctrl-C at chosen checkpoints of a job: ``(run, epoch, when)``, ``when`` "after"
    the checkpoint is written or "before" it (the epoch's metrics line already logged)."""

    def __init__(self, monkeypatch, *points):
        self.points = list(points)
        save_run = JobCheckpoint.save_run

        def stopping(checkpoint, index, state):
            point = self.points[0] if self.points else None
            if point == (index, state["epoch"], "before"):
                self.points.pop(0)
                raise KeyboardInterrupt
            save_run(checkpoint, index, state)
            if point == (index, state["epoch"], "after"):
                self.points.pop(0)
                raise KeyboardInterrupt

        monkeypatch.setattr(JobCheckpoint, "save_run", stopping)


def _job(config, root, resume=None):
    plan = plan_resume(config, resume, root=root, dataset=TINY_DATA)
    run_dir = RunDir("speedrun", root=root, path=plan.run_path)
    try:
        return run(config, run_dir=run_dir, dataset=TINY_DATA, resume=plan.state), run_dir.path, plan
    finally:
        run_dir.close()


@pytest.mark.parametrize("ablate", [False, True], ids=["runs", "ladder"])
def test_a_stopped_job_resumes_where_it_stopped(ablate, monkeypatch, tmp_path):
    recipe = SMALL.replace(epochs=3)
    # Two runs: of the recipe, or of the ladder's first two rungs (in a shuffled order).
    config = SpeedrunConfig(recipe=recipe, preset="tiny", runs=1 if ablate else 2, seed=3, warmup=False,
                            ablate=ablate, target=0.5)
    if ablate:
        monkeypatch.setattr(speedrun, "LADDER", speedrun.LADDER[:2])
    whole, _, _ = _job(config, tmp_path / "whole")

    root = tmp_path / "stopped"
    # Stopped twice: just after run 0's checkpoint at epoch 2, then in run 1 after its epoch-1
    # line was logged but before its checkpoint (that line is logged again after the resume).
    Stop(monkeypatch, (0, 2, "after"), (1, 1, "before"))
    with pytest.raises(KeyboardInterrupt):
        _job(config, root)
    (run_path,) = root.iterdir()
    state = load_checkpoint(run_path / "checkpoint.pt")
    assert state["current"]["index"] == 0 and state["current"]["run"]["epoch"] == 2 and not state["done"]
    with pytest.raises(KeyboardInterrupt):
        _job(config, root, resume="auto")
    state = load_checkpoint(run_path / "checkpoint.pt")
    assert len(state["done"]) == 1 and state["current"] is None  # run 1 stopped before its first checkpoint
    summary, resumed_path, plan = _job(config, root, resume="auto")
    assert resumed_path == run_path and plan.note.startswith(f"resuming {run_path}: 1 of ")
    assert not list(run_path.glob("checkpoint*.pt"))  # complete: nothing left to resume

    if ablate:
        assert summary["order"] == whole["order"]
        for got, want in zip(summary["rungs"], whole["rungs"]):
            assert got["final_accuracy_runs"] == want["final_accuracy_runs"]
            assert got["epochs_to_target"] == want["epochs_to_target"]
        assert sum(row["resumed_runs"] for row in summary["rungs"]) == 1
        lines = [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines()]
        assert [(m["repeat"], m["rung"]) for m in lines] == [tuple(o) for o in whole["order"]]
        return
    assert [r["tta_accuracy"] for r in summary["runs"]] == [r["tta_accuracy"] for r in whole["runs"]]
    assert [r["accuracy"] for r in summary["runs"]] == [r["accuracy"] for r in whole["runs"]]
    first, second = summary["runs"]
    assert first["resumed"] and len(first["time_parts_s"]) == 2
    assert first["time_s"] == pytest.approx(sum(first["time_parts_s"]))
    assert not second["resumed"]  # stopped before its first checkpoint: it ran again from the start
    # Each (run, epoch) logged once, in order, with the losses of the job never stopped.
    lines = [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines()]
    never = [json.loads(line) for line in next((tmp_path / "whole").glob("*/metrics.jsonl")).read_text().splitlines()]
    assert [(m["run"], m["epoch"]) for m in lines] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert [m["train_loss"] for m in lines] == [m["train_loss"] for m in never]


def test_resume_auto_finds_only_a_job_of_the_same_settings(tmp_path, monkeypatch):
    config = SpeedrunConfig(recipe=SMALL.replace(epochs=3), preset="tiny", runs=1, warmup=False)
    root = tmp_path / "runs"
    plan = plan_resume(config, "auto", root=root, dataset=TINY_DATA)
    assert plan.state is None and plan.run_path is None
    assert plan.note == f"no stopped speedrun of these settings under {root}; starting fresh"
    Stop(monkeypatch, (0, 1, "after"))
    with pytest.raises(KeyboardInterrupt):
        _job(config, root)
    other = SpeedrunConfig(recipe=SMALL.replace(epochs=3), preset="tiny", runs=1, seed=1, warmup=False)
    plan = plan_resume(other, "auto", root=root, dataset=TINY_DATA)
    assert plan.state is None and "(1 stopped job(s) of other settings there)" in plan.note
    (run_path,) = root.iterdir()
    with pytest.raises(ConfigError, match=r"with different settings: seed: checkpoint 0, now 1"):
        plan_resume(other, run_path, dataset=TINY_DATA)
    found = plan_resume(config, run_path / "checkpoint.pt", dataset=TINY_DATA)
    assert found.run_path == run_path and found.state["current"]["run"]["epoch"] == 1
    save_checkpoint(tmp_path / "train.pt", {"step": 3, "model": {}})
    with pytest.raises(CheckpointError, match="not a hasten speedrun checkpoint"):
        plan_resume(config, tmp_path / "train.pt", dataset=TINY_DATA)
