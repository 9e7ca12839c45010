"""The CIFAR-10 speedrun: the single-GPU bag of tricks, every trick switchable.

Lineage: David Page, "How to train your ResNet" (2018; 94% in 26 s on a V100
after the ladder in ``LADDER``), then Keller Jordan's airbench (2024; 94% in
3.3 s on an A100: 2x2 whitening, identity init, alternating flip, multi-crop TTA,
Lookahead). ``PRESETS['airbench94']`` is airbench94's hyperparameters; ``cpu`` is
a smaller net and schedule that finishes in minutes on a 2-core machine.

``run(SpeedrunConfig(...))`` is the whole job: load the data, untimed warm-up
runs, then N timed runs of the recipe (or the ablation ladder), a summary, a run
directory and plots. ``train_run`` is one run. A job stopped part way resumes
from its checkpoint (``JobCheckpoint``, ``plan_resume``): finished runs kept, the
run in progress continued from its last epoch end with the same result.

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
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from hasten import stats
from hasten.checkpoint import (CHECKPOINT_NAME, CheckpointError, load_checkpoint, newest_checkpoint, previous_path,
                               rng_state, save_checkpoint, set_rng_state)
from hasten.data import ImageDataset
from hasten.data.device_loader import Augmentation, GpuLoader
from hasten.data.host_loader import HostLoader
from hasten.data.normalize import channel_stats, normalize
from hasten.environment import describe_environment
from hasten.errors import ConfigError
from hasten.models.speedrun_net import NetConfig, SpeedrunNet
from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay
from hasten.nn.precision import autocast, cross_entropy, native_bf16
from hasten.nn.tta import TTA_LEVELS, evaluate
from hasten.nn.whitening import init_whitening_conv
from hasten.progress import progress
from hasten.recipes.step import TrainMeter, optimizer_step
from hasten.recipes.training_data import load_training_data
from hasten.rundir import config_digest, runs_root
from hasten.timing import Stopwatch, interleaved

# ----------------------------------------------------------------------------
# Hyperparameters
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    net: NetConfig = NetConfig()
    epochs: float = 9.9               # fractional: the last epoch stops early
    batch_size: int = 1024
    lr: float = 11.5                  # learning rate per 1024 examples (loss summed, not averaged)
    momentum: float = 0.85            # Nesterov
    weight_decay: float = 0.0153      # per 1024 examples, decoupled from the learning rate
    bias_scaler: float = 64.0         # lr multiplier for BN biases (their scales are frozen)
    label_smoothing: float = 0.2
    warmup_frac: float = 0.23         # lr: 0.2 -> 1.0 over this fraction of steps, then -> 0.07
    whiten: bool = True               # whitening conv initialised from data and frozen
    whiten_sample: str = "random"     # random: a seeded sample of 5,000 training images; first: airbench's
                                      # first 5,000 (a fair sample only of pre-shuffled files such as
                                      # CIFAR-10's; of class-ordered folders it is one class)
    whiten_bias_epochs: int = 3       # the whitening bias trains this many epochs, then freezes
    augment: Augmentation = Augmentation(translate=2, flip="alternating")
    averaging: str = "lookahead"      # none | ema (evaluate the EMA) | lookahead (copy back)
    ema_every: int = 5                # steps between weight-average updates
    ema_decay: float = 0.99           # for averaging=ema (Page); lookahead uses airbench's schedule
    tta: str = "flip_translate"       # none | flip | flip_translate
    device_loader: bool = True        # False: per-batch preprocessing on the host (ladder rung 0)
    bf16: bool = True                 # autocast to bfloat16 where it is native (CUDA; CPUs with AMX or
                                      # AVX512-BF16: hasten.nn.precision.native_bf16); float32 elsewhere
    channels_last: bool = True
    compile: bool = False             # torch.compile the model (CUDA; excluded from timing by warm-up)

    def __post_init__(self) -> None:
        if self.averaging not in ("none", "ema", "lookahead"):
            raise ValueError(f"Invalid averaging {self.averaging!r}; accepted: none, ema, lookahead")
        if self.whiten_sample not in ("random", "first"):
            raise ValueError(f"Invalid whiten_sample {self.whiten_sample!r}; accepted: random, first")
        if self.tta not in TTA_LEVELS:
            raise ValueError(f"Invalid tta {self.tta!r}; accepted: {', '.join(TTA_LEVELS)}")
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs, batch_size and lr must be positive: {self.epochs}, {self.batch_size}, {self.lr}")
        ghost = self.net.ghost_batch_size
        if ghost and self.batch_size % ghost:
            raise ValueError(f"the ghost batch norm size {ghost} must divide the batch size {self.batch_size}")

    def replace(self, **changes) -> "Recipe":
        """``dataclasses.replace``, where ``net.<field>`` keys change the network."""
        net_changes = {k[4:]: changes.pop(k) for k in list(changes) if k.startswith("net.")}
        return dataclasses.replace(self, net=dataclasses.replace(self.net, **net_changes), **changes)


PRESETS: dict[str, Recipe] = {
    # airbench94 (Keller Jordan): 94.0% on canonical CIFAR-10 in 3.83 s on an A100.
    "airbench94": Recipe(),
    # CPU: a quarter of the width, 6.5 epochs of batch 256: on a 2-core AVX2 EPYC an
    # epoch of batch 256 took 57 s against 69 s at batch 512 (the bare network's step), and
    # the smaller batch takes more steps per epoch. hasten 0.1 ran 8 epochs of batch 512
    # (CPU_0_1 below). Measured: docs/results/speedrun-cpu.md.
    "cpu": Recipe(net=NetConfig(widths=(32, 64, 128)), epochs=6.5, batch_size=256, lr=9.0),
    # A seconds-long preset for tests and smoke runs.
    "tiny": Recipe(net=NetConfig(widths=(16, 32, 32)), epochs=2, batch_size=256, lr=6.0,
                   whiten_bias_epochs=1, tta="flip"),
}


# hasten 0.1's cpu preset, for the comparison in benchmarks/speedrun_command.py.
CPU_0_1 = PRESETS["cpu"].replace(epochs=8, batch_size=512, whiten_sample="first")


def precision(recipe: Recipe, device: torch.device) -> str:
    """``bf16`` where the recipe asks for it and the device computes it natively
    (``native_bf16``), else ``fp32``: what ``train_run`` trains in."""
    return "bf16" if recipe.bf16 and native_bf16(device) else "fp32"


def choose_preset(requested: str, device: torch.device) -> tuple[str, str]:
    """The preset to run and why: ``requested`` unless it is ``auto``, which picks
    by device."""
    if requested != "auto":
        return requested, "asked for with --preset"
    if device.type == "cuda":
        return "airbench94", "CUDA device present: the full recipe"
    return "cpu", ("no CUDA device: the 'cpu' preset (narrower net, fewer epochs) finishes in minutes on "
                   "2 cores, where the full 'airbench94' recipe would take hours")


def build_recipe(preset: str, **changes) -> Recipe:
    """``PRESETS[preset]`` with ``changes`` (see ``Recipe.replace``); a
    ``ConfigError`` for an unknown preset or an invalid value."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {list(PRESETS)}")
    try:
        return PRESETS[preset].replace(**changes)
    except ValueError as exc:  # Recipe and NetConfig validate their own fields
        raise ConfigError(str(exc)) from None


def default_target(device: torch.device) -> float:
    """The ablation's accuracy target: airbench's 94% on CUDA, 80% (within reach of
    the ``cpu`` preset) elsewhere."""
    return 0.94 if device.type == "cuda" else 0.80


# Page's ladder (each rung adds one trick to the previous one), then airbench's
# additions. Rung 0 is the plain net: host-side preprocessing, ReLU, pool after
# activation, no label smoothing, trainable BN scales, no whitening, no weight
# averaging, no TTA, random flips, default init.
BASELINE_CHANGES = {
    "device_loader": False, "net.pool_before_act": False, "label_smoothing": 0.0,
    "net.activation": "relu", "net.ghost_batch_size": 0, "net.freeze_bn_scale": False,
    "bias_scaler": 1.0, "whiten": False, "averaging": "none", "tta": "none",
    "augment": Augmentation(translate=2, flip="random"), "net.dirac_init": False,
}
LADDER: list[tuple[str, dict]] = [
    ("baseline", {}),
    ("+ preprocessing on the device", {"device_loader": True}),
    ("+ max-pool before activation", {"net.pool_before_act": True}),
    ("+ label smoothing 0.2", {"label_smoothing": 0.2}),
    ("+ CELU", {"net.activation": "celu"}),
    ("+ ghost batch norm (32/chunk)", {"net.ghost_batch_size": 32}),
    ("+ frozen BN scale, bias lr x64", {"net.freeze_bn_scale": True, "bias_scaler": 64.0}),
    ("+ patch whitening", {"whiten": True}),
    ("+ EMA of weights", {"averaging": "ema"}),
    ("+ TTA: flip", {"tta": "flip"}),
    ("+ alternating flip", {"augment": "alternating"}),
    ("+ identity (dirac) init", {"net.dirac_init": True}),
    ("+ GELU, Lookahead (airbench)", {"net.activation": "gelu", "net.ghost_batch_size": 0, "averaging": "lookahead"}),
    ("+ TTA: flip + translate", {"tta": "flip_translate"}),
]


def ladder_recipes(top: Recipe) -> list[tuple[str, Recipe]]:
    """The cumulative rungs, each a full Recipe, ending in ``top`` with all tricks on."""
    recipe = top.replace(**BASELINE_CHANGES)
    rungs = []
    for name, changes in LADDER:
        changes = dict(changes)
        if changes.get("augment") == "alternating":
            changes["augment"] = dataclasses.replace(recipe.augment, flip="alternating")
        try:
            recipe = recipe.replace(**changes)
        except ValueError as exc:
            raise ConfigError(f"ablation rung {name!r}: {exc}") from None
        rungs.append((name, recipe))
    return rungs


@dataclass(frozen=True)
class SpeedrunConfig:
    """One ``run``: ``runs`` timed runs of ``recipe``, or its ablation ladder."""
    recipe: Recipe
    preset: str                       # the name ``recipe`` was built from, for the reports
    device: str = "cpu"               # cpu | cuda | cuda:N
    data: str | None = None           # folder, archive or CIFAR-10 binary (None: load_dataset's default)
    runs: int = 1                     # run i uses seed + i
    seed: int = 0
    train_subset: int = 0             # train on a seeded random subset of this many images; 0 = all
    warmup: bool = True               # an untimed warm-up run first (allocator, cuDNN autotune, compile)
    ablate: bool = False              # the ablation ladder (tricks added one by one) instead
    target: float = 0.94              # ablation: epochs and seconds to this accuracy are reported

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ConfigError(f"--runs must be >= 1, got {self.runs}")
        if not 0 < self.target <= 1:
            raise ConfigError(f"--target is an accuracy in (0, 1], got {self.target}")
        if self.train_subset < 0:
            raise ConfigError(f"--train-subset must be >= 0, got {self.train_subset}")


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


@dataclass
class RunResult:
    accuracy: float                  # final accuracy without TTA
    tta_accuracy: float              # final accuracy with the recipe's TTA (the headline number)
    time_s: float                    # timed span, see the module docstring
    cpu_time_s: float = 0.0          # process CPU seconds over the same span (all threads)
    epochs: list[dict] = field(default_factory=list)
    epochs_to_target: float | None = None
    time_to_target_s: float | None = None
    time_parts_s: list[float] = field(default_factory=list)  # timed seconds per process: one part, or
                                                             # before each stop and after the last resume

    def __post_init__(self) -> None:
        if not self.time_parts_s:  # a run never stopped: its time in one part
            self.time_parts_s = [self.time_s]


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
        for x, y in train_loader:
            with autocast(device, use_bf16):
                logits = step_model(x)
            loss = cross_entropy(logits, y, r.label_smoothing, reduction="sum")
            optimizer_step(loss, optimizer, scheduler)
            step += 1
            meter.update(loss, logits, y)
            bar.update()
            if average is not None and step % r.ema_every == 0:
                if r.averaging == "lookahead":
                    decay = decay_schedule[step].item()
                else:
                    decay = warmup_decay(r.ema_decay, step // r.ema_every - 1)
                average.update(model, decay)
            if step >= total_steps:
                if r.averaging == "lookahead":
                    average.update(model, 1.0)
                break
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
# Checkpoints: a stopped job resumed
# ----------------------------------------------------------------------------

CHECKPOINT_FORMAT = "hasten speedrun 1"
RESUME_AUTO = "auto"


def run_identity(config: SpeedrunConfig, dataset: ImageDataset | None = None) -> dict:
    """What a stopped job must share with a new one to be resumed by it: what its
    results depend on (recipe, runs, seed, data, device type, ladder and target), not
    how it is watched (warm-up, output files)."""
    if dataset is not None:
        data = f"{dataset.name} ({dataset.source})"
    else:
        data = config.data or "cifar10-download"
        if Path(data).expanduser().exists():
            data = str(Path(data).expanduser().resolve())
    return {"preset": config.preset, "recipe": dataclasses.asdict(config.recipe), "runs": config.runs,
            "seed": config.seed, "data": data, "train_subset": config.train_subset,
            "device": torch.device(config.device).type, "ablate": config.ablate,
            "target": config.target if config.ablate else None}


class JobCheckpoint:
    """A job's ``checkpoint.pt`` in its run directory (``hasten.checkpoint.save_checkpoint``:
    atomic, the one before kept as ``checkpoint-previous.pt``): the results of the runs
    finished and, at its last epoch end, the state of the run in progress. Its ``step``
    counts the job's training steps. ``directory=None`` keeps the bookkeeping, writes nothing."""

    def __init__(self, directory: str | os.PathLike | None, identity: dict, state: dict | None = None):
        self.path = Path(directory) / CHECKPOINT_NAME if directory is not None else None
        self.identity = identity
        self.done: list[RunResult] = [RunResult(**r) for r in state["done"]] if state is not None else []
        self.done_steps: int = state["done_steps"] if state is not None else 0
        self.current: dict | None = state["current"] if state is not None else None

    def resume_state(self, index: int) -> dict | None:
        """The saved state of run ``index`` when the job stopped inside it, else None."""
        current = self.current
        return current["run"] if current is not None and current["index"] == index else None

    def save_run(self, index: int, state: dict) -> None:
        """At an epoch end of run ``index`` (``train_run``'s ``on_checkpoint``)."""
        self.current = None  # the state holds the live tensors: saved, not kept
        self._save(self.done_steps + state["step"], {"index": index, "run": state})

    def finish(self, result: RunResult, steps: int) -> None:
        """A run ended: its result joins the finished ones."""
        self.done.append(result)
        self.done_steps += steps
        self.current = None
        self._save(self.done_steps, None)

    def remove(self) -> None:
        """The job is complete: nothing left to resume."""
        if self.path is not None:
            for path in (self.path, previous_path(self.path)):
                path.unlink(missing_ok=True)

    def _save(self, step: int, current: dict | None) -> None:
        if self.path is not None:
            save_checkpoint(self.path, {"format": CHECKPOINT_FORMAT, "step": step, "identity": self.identity,
                                        "digest": config_digest(self.identity),
                                        "done": [dataclasses.asdict(r) for r in self.done],
                                        "done_steps": self.done_steps, "current": current,
                                        # a resumed run uses the same threads: float sums split over
                                        # another count round in another order, and it would not end
                                        # bit for bit as the run never stopped
                                        "torch_threads": torch.get_num_threads()}, keep_previous=True)


def describe_checkpoint(state: dict, config: SpeedrunConfig) -> str:
    """How far a checkpointed job got, in words: "1 of 3 runs finished, run 1 to epoch 4 of 7"."""
    jobs = config.runs * (len(LADDER) if config.ablate else 1)
    text = f"{len(state['done'])} of {jobs} {'ladder runs' if config.ablate else 'runs'} finished"
    current = state["current"]
    if current is not None:
        text += f", run {current['index']} to epoch {current['run']['epoch']} of {math.ceil(config.recipe.epochs)}"
    return text


@dataclass(frozen=True)
class ResumePlan:
    """Where a job starts: the run directory to continue (None: a new one), the
    checkpoint state (None: fresh) and a line for the user (None: nothing to say)."""
    run_path: Path | None
    state: dict | None
    note: str | None


def plan_resume(config: SpeedrunConfig, resume: str | os.PathLike | None, root: str | os.PathLike | None = None,
                dataset: ImageDataset | None = None) -> ResumePlan:
    """Decide where a job starts.

    - ``resume=None``: fresh, in a new run directory.
    - ``resume="auto"``: the stopped job of the same settings (``run_identity``) whose
      checkpoint is newest, among the ``speedrun-*`` run directories under ``root``
      (default ``$HASTEN_RUNS``, else ``runs``); with none, fresh, said in the note.
    - ``resume=PATH``: that run directory or checkpoint file; a ``ConfigError`` naming
      the settings that differ when it was written with other ones.

    ``dataset``: the in-memory data set ``run`` will be given, if any (part of the settings)."""
    if resume is None:
        return ResumePlan(None, None, None)
    identity = run_identity(config, dataset)
    digest = config_digest(identity)
    if str(resume) == RESUME_AUTO:
        root = Path(root) if root is not None else runs_root()
        found, others = [], 0
        for directory in sorted(root.glob("speedrun-*")):
            newest = newest_checkpoint(directory)
            if newest is None:
                continue
            state = load_checkpoint(newest.path)
            if state.get("digest") == digest:
                found.append((newest.path.stat().st_mtime, directory, state))
            else:
                others += 1
        if not found:
            other = f" ({others} stopped job(s) of other settings there)" if others else ""
            return ResumePlan(None, None, f"no stopped speedrun of these settings under {root}{other}; starting fresh")
        _, directory, state = max(found, key=lambda f: f[0])
        return ResumePlan(directory, state, f"resuming {directory}: {describe_checkpoint(state, config)}")
    path = Path(resume).expanduser()
    newest = newest_checkpoint(path) if path.is_dir() else None
    if path.is_dir() and newest is None:
        raise ConfigError(f"{path} holds no complete speedrun checkpoint (finished jobs keep none)")
    state = load_checkpoint(newest.path if newest is not None else path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a hasten speedrun checkpoint")
    if state["digest"] != digest:
        now, saved = identity, state["identity"]
        diff = [f"{k}: checkpoint {saved.get(k)!r}, now {now[k]!r}" for k in now
                if config_digest({k: saved.get(k)}) != config_digest({k: now[k]})]
        raise ConfigError(f"cannot resume {path} with different settings: " + "; ".join(diff))
    directory = path if path.is_dir() else path.parent
    return ResumePlan(directory, state, f"resuming {directory}: {describe_checkpoint(state, config)}")


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
