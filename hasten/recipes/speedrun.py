"""The CIFAR-10 speedrun: the single-GPU bag of tricks, every trick switchable.

Lineage: David Page, "How to train your ResNet" (2018; 94% in 26 s on a V100
after the ladder in ``LADDER``), then Keller Jordan's airbench (2024; 94% in
3.3 s on an A100: 2x2 whitening, identity init, alternating flip, multi-crop TTA,
Lookahead). ``PRESETS['airbench94']`` is airbench94's hyperparameters; ``cpu`` is
a smaller net and schedule that finishes in minutes on a 2-core machine.

``run(SpeedrunConfig(...))`` is the whole job, here: load the data, untimed warm-up
runs, then N timed runs of the recipe (or the ablation ladder), a summary, a run
directory and plots. ``train_run`` is one run (``hasten.recipes.speedrun_train``,
re-exported here). A job stopped part way resumes
from its checkpoint (``hasten.recipes.speedrun_resume``): finished runs kept, the
run in progress continued from its last epoch end with the same result. The recipe,
presets and ladder are in ``hasten.recipes.speedrun_recipe`` (re-exported here).

Timing follows the speedrun community (airbench): data already decoded (cached)
and copied to the device, the networks built, warm-up runs excluded (``warm_up``:
every distinct recipe that compiles or runs on CUDA, ladder rungs included), the device
synchronised before every clock read; included are the loader set-up
(normalisation, padding on the device), the whitening set-up, every training step
and the final (TTA) evaluation; excluded is the validation (after the last epoch; every epoch for the ablation) that only
feeds the progress table.

Changes the training math: yes (it is a training recipe).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from hasten import stats
from hasten.data import ImageDataset
from hasten.data.normalize import channel_stats
from hasten.environment import describe_environment
from hasten.errors import ConfigError
from hasten.recipes.speedrun_recipe import (BASELINE_CHANGES, CPU_0_1, LADDER, PRESETS, Recipe, RunResult,  # noqa: F401
                                            SpeedrunConfig, build_recipe, choose_preset, default_target,
                                            ladder_recipes, precision)
from hasten.recipes.speedrun_resume import (CHECKPOINT_FORMAT, RESUME_AUTO, JobCheckpoint, ResumePlan,  # noqa: F401
                                            describe_checkpoint, plan_resume, run_identity)
from hasten.recipes.speedrun_cost import flops_per_run, steps_per_run
from hasten.recipes.speedrun_train import (WHITEN_BIAS_GROUP, WHITENING_SAMPLE, lr_factor,  # noqa: F401
                                           lr_lambdas, make_optimizer, train_run, whitening_sample)
from hasten.recipes.training_data import load_training_data
from hasten.rundir import config_digest
from hasten.timing import interleaved


TABLE_HEADER = (f"{'run':>3} {'epoch':>5} {'train_loss':>10} {'train_acc':>9} {'val_acc':>8} {'tta_acc':>8} "
                f"{'time_s':>8}")


def _cell(value: float | None) -> str:
    return f"{value:8.4f}" if value is not None else f"{'':>8}"


def epoch_row(run: int, rec: dict) -> str:
    """One line of the progress table: epoch as done/total, blank cells for what was
    not measured that epoch (validation runs after the last epoch only, unless asked)."""
    return (f"{run:>3} {rec['epoch']:>2}/{rec['epochs']:<2} {rec['train_loss']:>10.4f} {rec['train_accuracy']:>9.4f} "
            f"{_cell(rec['val_accuracy'])} {_cell(rec['tta_accuracy'])} {rec['time_s']:>8.2f}")
LADDER_HEADER = (f"{'rung':<34} {'reached':>7} {'epochs_to_target':>16} {'time_to_target_s':>16} {'final_acc':>9} "
                 f"{'std':>6} {'time_s':>8}")


def run(config: SpeedrunConfig, *, run_dir=None, dataset: ImageDataset | None = None,
        log: Callable[[str], None] | None = None, resume: dict | None = None) -> dict:
    """Load the data, warm up, then train ``config.runs`` timed runs of the recipe
    (or its ablation ladder); returns the summary (also ``results.json``).

    ``run_dir``: a ``hasten.rundir.RunDir`` for config, per-epoch metrics, results,
    plots and, until the job is complete, its checkpoint (``JobCheckpoint``: at every
    epoch end but a run's last, and at each run's end; the warm-up writes none).
    ``dataset``: an ``ImageDataset`` to use instead of loading ``config.data``.
    ``log``: receives the progress table, one line at a time. ``resume``: a
    checkpoint's state (``plan_resume``): the finished runs are kept, the run in
    progress continues from its last epoch end, the rest run as usual; a resumed
    run's time is its time before the stop plus its time after (``time_parts_s``)."""
    say = log if log is not None else (lambda line: None)
    device = torch.device(config.device)
    identity = run_identity(config, dataset)
    if resume is not None and resume.get("digest") != config_digest(identity):
        raise ConfigError("the checkpoint to resume was written with other settings (see plan_resume)")
    checkpoint = JobCheckpoint(run_dir.path if run_dir is not None else None, identity, resume)
    data = load_training_data(config.data, batch_size=config.recipe.batch_size,
                              train_subset=config.train_subset, dataset=dataset)
    say(f"data: {data.summary()}")
    configure_device(device)
    rungs = ladder_recipes(config.recipe) if config.ablate else []  # invalid rungs fail before any work
    mean_std = channel_stats(data.train.images)
    if run_dir is not None:
        run_dir.write_config({"preset": config.preset, "recipe": dataclasses.asdict(config.recipe),
                              "runs": config.runs, "seed": config.seed, "data": data.name,
                              "data_source": str(data.source), "device": str(device),
                              "train_subset": config.train_subset, "ablate": config.ablate,
                              "target": config.target,
                              "resumed_from": describe_checkpoint(resume, config) if resume is not None else None})
        if resume is not None:  # the lines logged after the checkpoint are logged again
            run_dir.drop_metrics_after(resume["step"], key="job_step")
    if config.warmup:
        warm_up([recipe for _, recipe in rungs] or [config.recipe], data, device, mean_std, seed=config.seed)
    if config.ablate:
        summary = _ladder(config, rungs, data, device, mean_std, run_dir, say, checkpoint)
    else:
        summary = _timed_runs(config, data, device, mean_std, run_dir, say, checkpoint)
    summary["environment"] = describe_environment(device)
    summary["rundir"] = str(run_dir.path) if run_dir is not None else None
    if run_dir is not None:
        run_dir.write_results(summary)
    checkpoint.remove()
    return summary


def configure_device(device: torch.device) -> None:
    """Process-wide settings for the speedrun, made before the warm-up (every path:
    timed runs, the ladder, benchmarks/speedrun.py). On CUDA: cuDNN autotuning
    (the shapes are fixed, so each convolution is tuned once, in the warm-up)."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True


def warm_up(recipes: list[Recipe], data: ImageDataset, device: torch.device, mean_std, *, seed: int = 0) -> None:
    """Untimed: first-call overheads (allocator, cuDNN autotuning, compilation) paid
    before the clock, by a short run of every distinct recipe that compiles or runs
    on CUDA (each ladder rung is its own graph and its own set of kernels), else of
    the first one only. Each recipe traces one training graph for its whole run:
    the whitening-bias freeze changes no guarded input (see ``train_run``)."""
    distinct = list(dict.fromkeys(recipes))
    if not any(r.compile for r in distinct) and device.type != "cuda":
        distinct = distinct[:1]
    compiled = sum(r.compile for r in distinct)
    if compiled:
        # Dynamo keeps this many graphs per function before falling back to eager:
        # every rung's graph must stay cached through the interleaved timed runs.
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), 2 * compiled))
    for r in distinct:
        steps = 30 if r.compile or device.type == "cuda" else 3
        train_run(r, data, device, mean_std=mean_std, seed=seed, max_steps=steps, label="warm-up: ")


def _timed_runs(config, data, device, mean_std, run_dir, say, checkpoint: JobCheckpoint | None = None) -> dict:
    checkpoint = checkpoint if checkpoint is not None else JobCheckpoint(None, {})
    say("timed: loader set-up, whitening set-up, training, final TTA evaluation; untimed: data loading "
        "and copy to the device, building the network, warm-up, validation")
    say(TABLE_HEADER)
    steps = steps_per_run(config.recipe, len(data.train.labels))
    results = []
    for i in range(config.runs):
        if i < len(checkpoint.done):  # finished before a stop: its rows again, from the checkpoint
            results.append(checkpoint.done[i])
            for rec in checkpoint.done[i].epochs:
                say(epoch_row(i, rec))
            continue
        state = checkpoint.resume_state(i)
        for rec in state["epochs"] if state is not None else []:
            say(epoch_row(i, rec))

        def on_epoch(rec, i=i):
            if run_dir is not None:
                run_dir.log(run=i, job_step=checkpoint.done_steps + rec["step"], **rec)
            say(epoch_row(i, rec))

        result = train_run(config.recipe, data, device, mean_std=mean_std, seed=config.seed + i, on_epoch=on_epoch,
                           resume=state, on_checkpoint=functools.partial(checkpoint.save_run, i),
                           label=f"run {i}: ", job_steps=(config.runs * steps, checkpoint.done_steps))
        checkpoint.finish(result, steps)
        results.append(result)
    summary = summarize(results, preset=config.preset, device=device, flops=flops_per_run(config.recipe, data),
                        data=data.name, precision=precision(config.recipe, device))
    if run_dir is not None:
        from hasten.plots import plot_curves

        curves = [(f"run {i}", [e["time_s"] for e in r.epochs], [e["train_accuracy"] for e in r.epochs])
                  for i, r in enumerate(results)]
        plot_curves(curves, run_dir.path / "accuracy_vs_time.png", xlabel="timed seconds",
                    ylabel="training accuracy (augmented batches)",
                    title=f"{config.preset} on {data.name} ({device.type})")
    return summary


def summarize(results: list[RunResult], *, preset: str, device: torch.device, flops: int, **extra) -> dict:
    """Mean and spread of accuracy and time over runs, and the achieved FLOP rate."""
    tta = [r.tta_accuracy for r in results]
    times = [r.time_s for r in results]
    return {
        "runs": [{"accuracy": r.accuracy, "tta_accuracy": r.tta_accuracy, "time_s": r.time_s,
                  "cpu_time_s": r.cpu_time_s, "resumed": len(r.time_parts_s) > 1, "time_parts_s": r.time_parts_s}
                 for r in results],
        "mean_accuracy": stats.mean(tta),  # headline: with the recipe's TTA, as airbench reports
        "std_accuracy": stats.sample_std(tta),  # None for one run: no spread measured
        "mean_accuracy_no_tta": stats.mean(r.accuracy for r in results),
        "mean_time_s": stats.mean(times),
        "std_time_s": stats.sample_std(times),
        "mean_cpu_time_s": stats.mean(r.cpu_time_s for r in results),
        "device": str(device),
        "preset": preset,
        "flops_per_run": flops,
        "achieved_tflops": flops / stats.mean(times) / 1e12,
        **extra,
    }


def _ladder(config, rungs, data, device, mean_std, run_dir, say, checkpoint: JobCheckpoint | None = None) -> dict:
    """Every rung ``config.runs`` times, interleaved: one run of each rung per repeat, in
    a shuffled order (``hasten.timing.interleaved``; repeat i uses seed ``config.seed + i``
    for every rung), so that load drifting during the ladder spreads over all rungs
    instead of showing up as one trick's cost. Each run is logged as it ends (the
    run directory's metrics); the rows average them per rung."""
    say(f"ablation ladder: {len(rungs)} rungs, tricks added one by one, {config.runs} run(s) each in a shuffled "
        f"order, target {config.target:.2%} (epochs and timed seconds at the first epoch whose accuracy reaches it)")
    checkpoint = checkpoint if checkpoint is not None else JobCheckpoint(None, {})
    results: dict[str, list[RunResult]] = {name: [] for name, _ in rungs}
    order = []
    jobs = list(interleaved(rungs, config.runs, seed=config.seed))
    steps = [steps_per_run(recipe, len(data.train.labels)) for _, (_, recipe) in jobs]
    for j, (rep, (name, recipe)) in enumerate(jobs):
        if j < len(checkpoint.done):  # finished before a stop
            r = checkpoint.done[j]
        else:
            r = train_run(recipe, data, device, mean_std=mean_std, seed=config.seed + rep, target=config.target,
                          resume=checkpoint.resume_state(j), on_checkpoint=functools.partial(checkpoint.save_run, j),
                          label=f"{name} (repeat {rep}): ", job_steps=(sum(steps), checkpoint.done_steps))
            if run_dir is not None:
                run_dir.log(rung=name, repeat=rep, job_step=checkpoint.done_steps + steps[j],
                            tta_accuracy=r.tta_accuracy, time_s=r.time_s, time_parts_s=r.time_parts_s,
                            epochs_to_target=r.epochs_to_target, time_to_target_s=r.time_to_target_s)
            checkpoint.finish(r, steps[j])
        results[name].append(r)
        order.append([rep, name])
        say(f"  repeat {rep} {name:<34} {r.tta_accuracy:.4f} {r.time_s:7.1f} s")
    say(LADDER_HEADER)
    rows = []
    for name, _ in rungs:
        runs = results[name]
        reached = [r for r in runs if r.epochs_to_target is not None]
        acc = [r.tta_accuracy for r in runs]
        times = [r.time_s for r in runs]
        row = {"rung": name, "runs": len(runs), "reached": len(reached),
               "epochs_to_target": stats.mean(r.epochs_to_target for r in reached),
               "time_to_target_s": stats.mean(r.time_to_target_s for r in reached),
               "final_accuracy": stats.mean(acc), "final_accuracy_std": stats.sample_std(acc),
               "final_accuracy_runs": acc,
               "time_s": stats.mean(times), "time_s_std": stats.sample_std(times), "time_s_runs": times,
               "cpu_time_s": stats.mean(r.cpu_time_s for r in runs),
               "resumed_runs": sum(len(r.time_parts_s) > 1 for r in runs)}
        rows.append(row)
        ep = f"{row['epochs_to_target']:.1f}" if reached else "not reached"
        tt = f"{row['time_to_target_s']:.1f}" if reached else "-"
        acc_std = f"{row['final_accuracy_std']:.4f}" if row["final_accuracy_std"] is not None else "-"
        say(f"{name:<34} {len(reached):>3}/{len(runs):<3} {ep:>16} {tt:>16} {row['final_accuracy']:>9.4f} {acc_std:>6} "
            f"{row['time_s']:>8.1f}")
    if run_dir is not None:
        from hasten.plots import plot_bars

        plot_bars([r["rung"] for r in rows], [r["final_accuracy"] for r in rows], run_dir.path / "ablation.png",
                  xlabel="final accuracy (with the rung's TTA)",
                  title=f"Ablation ladder on {data.name} ({device.type})")
    return {"preset": config.preset, "target": config.target, "epochs_budget": config.recipe.epochs,
            "device": str(device), "data": data.name, "train_subset": config.train_subset,
            "runs_per_rung": config.runs, "order": order, "rungs": rows}
