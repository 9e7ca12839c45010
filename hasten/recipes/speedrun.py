"""The CIFAR-10 speedrun: the single-GPU bag of tricks, every trick switchable.

Lineage: David Page, "How to train your ResNet" (2018; 94% in 26 s on a V100
after the ladder in ``LADDER``), then Keller Jordan's airbench (2024; 94% in
3.3 s on an A100: 2x2 whitening, identity init, alternating flip, multi-crop TTA,
Lookahead). ``PRESETS['airbench94']`` is airbench94's hyperparameters; ``cpu`` is
a smaller net and schedule that finishes in minutes on a 2-core machine.

``run(SpeedrunConfig(...))`` is the whole job: load the data, untimed warm-up
runs, then N timed runs of the recipe (or the ablation ladder), a summary, a run
directory and plots. ``train_run`` is one run. A job stopped part way resumes
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
import math
from typing import Callable

import torch
from torch import nn

from hasten import stats
from hasten.checkpoint import rng_state, set_rng_state
from hasten.data import ImageDataset
from hasten.data.device_loader import GpuLoader
from hasten.data.host_loader import HostLoader
from hasten.data.normalize import channel_stats, normalize
from hasten.environment import describe_environment
from hasten.errors import ConfigError
from hasten.models.speedrun_net import SpeedrunNet
from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay
from hasten.nn.precision import cross_entropy
from hasten.nn.tta import evaluate
from hasten.nn.whitening import init_whitening_conv
from hasten.progress import progress
from hasten.recipes.speedrun_recipe import (BASELINE_CHANGES, CPU_0_1, LADDER, PRESETS, Recipe, RunResult,  # noqa: F401
                                            SpeedrunConfig, build_recipe, choose_preset, default_target,
                                            ladder_recipes, precision)
from hasten.recipes.speedrun_resume import (CHECKPOINT_FORMAT, RESUME_AUTO, JobCheckpoint, ResumePlan,  # noqa: F401
                                            describe_checkpoint, plan_resume, run_identity)
from hasten.recipes.loop import train_loop
from hasten.recipes.step import TrainMeter
from hasten.recipes.training_data import load_training_data
from hasten.rundir import config_digest
from hasten.timing import Stopwatch, interleaved


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------


WHITEN_BIAS_GROUP = 2  # index of the whitening bias's own parameter group


def make_optimizer(model: nn.Module, r: Recipe) -> torch.optim.Optimizer:
    """Nesterov SGD with airbench's scaling: the summed loss and ``lr`` per 1024
    examples are turned into PyTorch's per-step lr, weight decay is decoupled from
    the lr (applied as wd/lr so lr*wd stays fixed), BN biases get ``bias_scaler`` x lr.

    Groups: BN biases, the other weights, and the whitening bias alone (same
    hyperparameters as the other weights) so that ``lr_lambdas`` can freeze it by
    setting its lr to 0. Fused SGD on CUDA (one kernel for the whole step, same
    update rule), the multi-tensor (foreach) implementation elsewhere."""
    kilostep_scale = 1024 * (1 + 1 / (1 - r.momentum))
    lr = r.lr / kilostep_scale
    wd = r.weight_decay * r.batch_size / kilostep_scale
    whiten_bias = model.whiten.bias
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p is not whiten_bias]
    norm_biases = [p for n, p in named if "norm" in n]
    others = [p for n, p in named if "norm" not in n]
    groups = [dict(params=norm_biases, lr=lr * r.bias_scaler, weight_decay=wd / (lr * r.bias_scaler)),
              dict(params=others, lr=lr, weight_decay=wd / lr),
              dict(params=[whiten_bias], lr=lr, weight_decay=wd / lr)]
    on_cuda = whiten_bias.device.type == "cuda"
    return torch.optim.SGD(groups, momentum=r.momentum, nesterov=True,
                           **({"fused": True} if on_cuda else {"foreach": True}))


def lr_lambdas(r: Recipe, total_steps: int, steps_per_epoch: int) -> list[Callable[[int], float]]:
    """Per parameter group of ``make_optimizer``, the lr multiplier at each step:
    airbench's triangle, and for the whitening bias the same until it freezes after
    ``whiten_bias_epochs`` epochs, then 0 (with lr 0 neither momentum nor weight
    decay can move it: SGD's update is lr times both)."""
    freeze_step = steps_per_epoch * r.whiten_bias_epochs

    def factor(s: int) -> float:
        return lr_factor(s, total_steps, r.warmup_frac)

    def whiten_bias(s: int) -> float:
        return factor(s) if s < freeze_step else 0.0

    return [factor, factor, whiten_bias]


def lr_factor(step: int, total: int, warmup_frac: float) -> float:
    """airbench's triangle: 0.2 -> 1.0 linearly over the warm-up, then -> 0.07."""
    warmup = int(total * warmup_frac)
    if step < warmup:
        return 0.2 + 0.8 * step / warmup
    return 1.0 + (0.07 - 1.0) * (step - warmup) / max(total - warmup, 1)




def train_run(recipe: Recipe, data: ImageDataset, device: torch.device, *,
              mean_std: tuple[list[float], list[float]], seed: int = 0, target: float | None = None,
              on_epoch: Callable[[dict], None] | None = None, max_steps: int | None = None,
              validate_every_epoch: bool = False, resume: dict | None = None,
              on_checkpoint: Callable[[dict], None] | None = None, label: str = "",
              job_steps: tuple[int, int] | None = None) -> RunResult:
    """Train and evaluate one run of ``recipe`` on ``data``.

    ``mean_std``: per-channel normalisation, a property of the data set: measure it
    once with ``channel_stats`` and pass it to every run. ``target``: also record
    the first epoch (and timed seconds) at which validation accuracy (with the
    recipe's TTA) reaches it; that costs a TTA evaluation per epoch, which is not
    timed. ``validate_every_epoch``: measure validation accuracy (no TTA, untimed)
    after every epoch, not only the last; with a target it is measured anyway.
    ``max_steps``: stop after that many steps without evaluating (warm-up runs: only
    the first-call costs of the training step matter there).

    ``on_checkpoint``: called at the end of every epoch but the last, outside the
    clock, with the run's state (model, optimizer, schedule, weight average, data
    position, random state, timed seconds, the epochs so far),
    which ``resume`` continues from: the same steps on the same batches, so on the
    CPU the run ends with the same weights, bit for bit, as one never stopped. The
    resumed run's clock starts from the state's seconds and times the loader set-up
    again (not the whitening set-up: its filters are in the model's state).
    ``label`` and ``job_steps`` (steps of the whole job, steps it did before this
    run) set the progress line: ``run 0: epoch 2/7: 130/700 steps ..., about 0:04:10 left``."""
    r = recipe
    torch.manual_seed(seed)
    use_bf16 = precision(r, device) == "bf16"
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    memory_format = torch.channels_last if r.channels_last else torch.contiguous_format
    mean, std = mean_std

    # Untimed, as in airbench: the uint8 images copied to the device, the networks built.
    train_images, train_labels = data.train.images.to(device), data.train.labels.to(device)
    test_images, test_y = data.test.images.to(device), data.test.labels.to(device)
    model = SpeedrunNet(r.net).to(device=device, memory_format=memory_format)
    # The EMA is evaluated on a second network, built here rather than at each evaluation.
    averaged = SpeedrunNet(r.net).to(device=device, memory_format=memory_format) if r.averaging == "ema" else None

    clock = Stopwatch(device)
    parts_before: list[float] = []  # timed seconds of the processes before a stop
    if resume is not None:
        clock.elapsed, clock.cpu_elapsed = resume["time_s"], resume["cpu_time_s"]
        parts_before = [*resume["time_parts_s"], resume["time_s"] - sum(resume["time_parts_s"])]
    clock.start()
    if r.device_loader:
        train_loader = GpuLoader(train_images, train_labels, r.batch_size, device=device, augment=r.augment,
                                 mean=mean, std=std, dtype=dtype, channels_last=r.channels_last, seed=seed)
    else:  # ladder rung 0: every batch prepared on the host from the host copy
        train_loader = HostLoader(data.train.images, data.train.labels, r.batch_size, device=device,
                                  augment=r.augment, mean=mean, std=std, dtype=dtype,
                                  channels_last=r.channels_last, seed=seed)
    test_x = normalize(test_images, mean, std, dtype, channels_last=r.channels_last)
    if r.whiten and resume is None:
        sample = (whitening_sample(len(train_labels), seed=seed) if r.whiten_sample == "random"
                  else torch.arange(min(WHITENING_SAMPLE, len(train_labels)))).to(device)
        init_whitening_conv(model.whiten, normalize(train_images[sample], mean, std))
    elif r.whiten:
        model.whiten.weight.requires_grad_(False)  # frozen, as init_whitening_conv leaves it; filters from the state
    optimizer = make_optimizer(model, r)
    total_steps = math.ceil(len(train_loader) * r.epochs)
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambdas(r, total_steps, len(train_loader)))
    decay_schedule = airbench_decay_schedule(total_steps)
    average: WeightAverage | None = None
    if r.averaging == "lookahead":
        average = Lookahead(model)
    elif r.averaging == "ema":
        average = WeightAverage(model)
    step_model = torch.compile(model) if r.compile else model
    meter = TrainMeter(device)
    result = RunResult(accuracy=0.0, tta_accuracy=0.0, time_s=0.0)
    step, epoch = 0, 0
    if resume is not None:
        clock.stop()  # restoring is the resume's cost, not the recipe's, as building the network is
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        if average is not None:
            average.load_state_dict(resume["average"])
        step, epoch = resume["step"], resume["epoch"]
        train_loader.epoch = epoch  # each epoch's order and augmentation follow from (seed, epoch)
        set_rng_state(resume["rng"])
        result.epochs = list(resume["epochs"])
        result.epochs_to_target, result.time_to_target_s = resume["epochs_to_target"], resume["time_to_target_s"]
        clock.start()
    job_total, job_before = job_steps if job_steps is not None else (total_steps, 0)

    def eval_batches():
        for i in range(0, len(test_y), 2000):
            yield test_x[i:i + 2000], test_y[i:i + 2000]

    def eval_model() -> nn.Module:
        if averaged is None:
            return model
        averaged.load_state_dict(model.state_dict())
        average.copy_to(averaged)
        return averaged

    def run_state() -> dict:
        return {"step": step, "epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "average": average.state_dict() if average is not None else None,
                "rng": rng_state(), "time_s": clock.elapsed, "cpu_time_s": clock.cpu_elapsed,
                "time_parts_s": parts_before, "epochs": list(result.epochs),
                "epochs_to_target": result.epochs_to_target, "time_to_target_s": result.time_to_target_s}

    def loss_fn(logits, y):  # summed, as airbench's lr per 1024 examples expects (make_optimizer)
        return cross_entropy(logits, y, r.label_smoothing, reduction="sum")

    def after_step(s) -> None:
        meter.update(s.loss, s.logits, s.y)
        bar.update()
        if average is not None and s.number % r.ema_every == 0:
            if r.averaging == "lookahead":
                decay = decay_schedule[s.number].item()
            else:
                decay = warmup_decay(r.ema_decay, s.number // r.ema_every - 1)
            average.update(model, decay)
        if s.number >= total_steps and r.averaging == "lookahead":
            average.update(model, 1.0)

    while step < total_steps:
        # The whitening bias trains only for the first epochs (airbench); its lr
        # drops to 0 then (``lr_lambdas``). Eager, also stop its gradient: that skips
        # the first conv group's input gradient. Compiled, leave requires_grad alone:
        # it is guarded, and flipping it would recompile mid-run, inside the clock.
        if not r.compile:
            model.whiten.bias.requires_grad_(epoch < r.whiten_bias_epochs)
        model.train()
        meter.reset()
        # One bar per epoch (closed before the epoch's table row is printed), counting the
        # steps of the whole job: its rate and time left are the job's.
        bar = progress(total=job_total, initial=job_before + step, unit="step",
                       desc=f"{label}epoch {epoch + 1}/{math.ceil(r.epochs)}")
        step = train_loop(step_model, optimizer, train_loader, loss_fn, scheduler=scheduler, device=device,
                          bf16=use_bf16, step=step, stop_after=total_steps, after_step=after_step)
        bar.close()
        epoch += 1
        clock.stop()
        if max_steps is not None and step >= max_steps:
            return result  # a warm-up: nothing to evaluate
        # Untimed: validation for the table (every epoch only if asked or for the target:
        # on a CPU each pass costs a fifth of an epoch of training).
        last = step >= total_steps
        evaluated = eval_model()
        record = {"epoch": epoch, "epochs": math.ceil(r.epochs), "step": step, "train_loss": meter.loss,
                  "train_accuracy": meter.accuracy, "val_accuracy": None, "tta_accuracy": None,
                  "time_s": clock.elapsed}
        if last or validate_every_epoch or target is not None:
            record["val_accuracy"] = evaluate(evaluated, eval_batches(), "none", bf16=use_bf16)
        if target is not None and result.epochs_to_target is None and r.tta != "none":
            record["tta_accuracy"] = evaluate(evaluated, eval_batches(), r.tta, bf16=use_bf16)
        reached = record["tta_accuracy"] if record["tta_accuracy"] is not None else record["val_accuracy"]
        if target is not None and result.epochs_to_target is None and reached is not None and reached >= target:
            result.epochs_to_target = min(epoch, r.epochs)
            result.time_to_target_s = clock.elapsed
        result.epochs.append(record)
        if step < total_steps:
            if on_epoch is not None:
                on_epoch(record)
            if on_checkpoint is not None:
                on_checkpoint(run_state())
            clock.start()

    # Timed: the final evaluation with the recipe's TTA.
    clock.start()
    result.tta_accuracy = evaluate(eval_model(), eval_batches(), r.tta, bf16=use_bf16)
    clock.stop()
    result.time_s = clock.elapsed
    result.cpu_time_s = clock.cpu_elapsed
    result.time_parts_s = [*parts_before, result.time_s - sum(parts_before)]
    result.accuracy = result.epochs[-1]["val_accuracy"]
    result.epochs[-1]["tta_accuracy"] = result.tta_accuracy
    result.epochs[-1]["time_s"] = result.time_s
    if on_epoch is not None:
        on_epoch(result.epochs[-1])
    return result


WHITENING_SAMPLE = 5000  # images whose patch covariance sets the whitening layer (airbench)


def whitening_sample(n_images: int, *, seed: int, size: int = WHITENING_SAMPLE) -> torch.Tensor:
    """Indices of a seeded uniform random sample of ``size`` training images (all of
    them if there are fewer) for the whitening statistics.

    airbench takes the first 5,000 images, which is a random sample only because the
    canonical CIFAR-10 files are already shuffled; image folders and JPEG archives load
    in class order, where the first 5,000 are a single class."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n_images, generator=generator)[:size]


def flops_per_run(recipe: Recipe, data: ImageDataset) -> int:
    """Training plus final-evaluation FLOPs of one run (torch.utils.flop_counter),
    counted on a 2-image batch and scaled: convolution and matmul FLOPs only.

    Counted as the run trains: a whitened first layer's frozen weight gets no
    gradient, and once its bias freezes (after ``whiten_bias_epochs``) nothing
    before the first conv group trains, so eager runs skip that group's input
    gradient; compiled runs keep computing it (the bias keeps ``requires_grad``, its
    lr is 0), and are charged for it."""
    from torch.utils.flop_counter import FlopCounterMode

    model = SpeedrunNet(recipe.net)
    model.whiten.weight.requires_grad_(not recipe.whiten)
    x = torch.zeros(2, 3, *data.train.images.shape[-2:])

    def train_flops_per_example(bias_trains: bool) -> float:
        model.whiten.bias.requires_grad_(bias_trains)
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        return counter.get_total_flops() / 2

    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    forward_per_example = counter.get_total_flops() / 2
    model.train()
    steps_per_epoch = len(data.train.labels) // recipe.batch_size  # the loader drops the last partial batch
    steps = steps_per_run(recipe, len(data.train.labels))
    bias_steps = steps if recipe.compile else min(steps, steps_per_epoch * recipe.whiten_bias_epochs)
    train = (train_flops_per_example(True) * bias_steps + train_flops_per_example(False) * (steps - bias_steps))
    views = {"none": 1, "flip": 2, "flip_translate": 6}[recipe.tta]
    return int(train * recipe.batch_size + forward_per_example * views * len(data.test.labels))


def steps_per_run(recipe: Recipe, n_train: int) -> int:
    """Training steps of one run on ``n_train`` images (the loader drops the last partial batch)."""
    return math.ceil(n_train // recipe.batch_size * recipe.epochs)


# ----------------------------------------------------------------------------
# The job: warm-up, timed runs or the ablation ladder, summary
# ----------------------------------------------------------------------------

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
