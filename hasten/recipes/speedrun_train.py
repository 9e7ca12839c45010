"""One run of the CIFAR-10 speedrun (``train_run``): the recipe's optimizer
(``make_optimizer``: airbench's Nesterov SGD, lr per 1024 examples, decoupled weight
decay), its schedule (``lr_lambdas``: airbench's triangle, the whitening bias frozen
after its epochs), the whitening set-up, the training through
``hasten.recipes.loop.train_loop`` with the weight average after the step, the
per-epoch validation, and the timed final evaluation with TTA; and what a run costs
(``flops_per_run``, ``steps_per_run``).

Lineage and timing rules: ``hasten.recipes.speedrun``, which runs the job around
this (warm-up, timed runs, the ablation ladder, the summary).

Changes the training math: yes (it is a training recipe).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from hasten.checkpoint import rng_state, set_rng_state
from hasten.data import ImageDataset
from hasten.data.device_loader import GpuLoader
from hasten.data.host_loader import HostLoader
from hasten.data.normalize import normalize
from hasten.models.speedrun_net import SpeedrunNet
from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay
from hasten.nn.precision import cross_entropy
from hasten.nn.tta import evaluate
from hasten.nn.whitening import init_whitening_conv
from hasten.progress import progress
from hasten.recipes.loop import Step, train_loop
from hasten.recipes.speedrun_recipe import Recipe, RunResult, precision
from hasten.recipes.step import TrainMeter
from hasten.timing import Stopwatch


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

    # Untimed, as in airbench: the uint8 images copied to the device, the networks built.
    train_images, train_labels = data.train.images.to(device), data.train.labels.to(device)
    test_images, test_y = data.test.images.to(device), data.test.labels.to(device)
    model, averaged = _networks(r, device)

    # Timed from here: the loader, the whitening, the training, the final evaluation.
    clock, parts_before = _clock(device, resume)
    clock.start()
    train_loader = _train_loader(r, data, train_images, train_labels, device, mean_std, use_bf16, seed)
    test_x = normalize(test_images, *mean_std, torch.bfloat16 if use_bf16 else torch.float32,
                       channels_last=r.channels_last)
    _whiten(model, r, train_images, mean_std, seed, resumed=resume is not None)
    optimizer = make_optimizer(model, r)
    total_steps = math.ceil(len(train_loader) * r.epochs)
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambdas(r, total_steps, len(train_loader)))
    averaging = WeightAveraging(r, model, averaged, total_steps)
    step_model = torch.compile(model) if r.compile else model
    meter = TrainMeter(device)
    result = RunResult(accuracy=0.0, tta_accuracy=0.0, time_s=0.0)
    validation = Validation(r, test_x, test_y, averaging, use_bf16, target, validate_every_epoch, result)
    step, epoch = 0, 0
    if resume is not None:
        step, epoch = _restore(resume, clock, model, optimizer, scheduler, averaging, train_loader, result)
    job_total, job_before = job_steps if job_steps is not None else (total_steps, 0)

    def loss_fn(logits, y):  # summed, as airbench's lr per 1024 examples expects (make_optimizer)
        return cross_entropy(logits, y, r.label_smoothing, reduction="sum")

    def after_step(s) -> None:
        meter.update(s.loss, s.logits, s.y)
        bar.update()
        averaging.after_step(s)

    while step < total_steps:
        _start_epoch(model, r, epoch)
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
        record = validation.epoch_end(epoch, step, meter, clock.elapsed, last=step >= total_steps)
        if step < total_steps:
            if on_epoch is not None:
                on_epoch(record)
            if on_checkpoint is not None:
                on_checkpoint(_state(step, epoch, model, optimizer, scheduler, averaging, clock, parts_before, result))
            clock.start()

    validation.final(clock, parts_before)
    if on_epoch is not None:
        on_epoch(result.epochs[-1])
    return result


# ----------------------------------------------------------------------------- the run's parts
def _networks(r: Recipe, device: torch.device) -> tuple[nn.Module, nn.Module | None]:
    """The network, and for an EMA the second network it is evaluated on (built here, not at
    each evaluation)."""
    memory_format = torch.channels_last if r.channels_last else torch.contiguous_format
    model = SpeedrunNet(r.net).to(device=device, memory_format=memory_format)
    averaged = SpeedrunNet(r.net).to(device=device, memory_format=memory_format) if r.averaging == "ema" else None
    return model, averaged


def _clock(device: torch.device, resume: dict | None) -> tuple[Stopwatch, list[float]]:
    """The run's clock, and the timed seconds of the processes before a stop: a resumed
    run's clock goes on from the state's seconds."""
    clock = Stopwatch(device)
    if resume is None:
        return clock, []
    clock.elapsed, clock.cpu_elapsed = resume["time_s"], resume["cpu_time_s"]
    return clock, [*resume["time_parts_s"], resume["time_s"] - sum(resume["time_parts_s"])]


def _train_loader(r: Recipe, data: ImageDataset, train_images, train_labels, device, mean_std, bf16: bool,
                  seed: int):
    """The training batches, augmented and normalised on the device (``GpuLoader``), or, ladder
    rung 0, every batch prepared on the host from the host copy (``HostLoader``)."""
    mean, std = mean_std
    dtype = torch.bfloat16 if bf16 else torch.float32
    if r.device_loader:
        return GpuLoader(train_images, train_labels, r.batch_size, device=device, augment=r.augment,
                         mean=mean, std=std, dtype=dtype, channels_last=r.channels_last, seed=seed)
    return HostLoader(data.train.images, data.train.labels, r.batch_size, device=device, augment=r.augment,
                      mean=mean, std=std, dtype=dtype, channels_last=r.channels_last, seed=seed)


def _whiten(model: nn.Module, r: Recipe, train_images, mean_std, seed: int, *, resumed: bool) -> None:
    """The whitening layer's filters from the training images' patch covariance, frozen
    (``r.whiten``); resumed, frozen as they are: the filters come with the state."""
    if r.whiten and not resumed:
        sample = (whitening_sample(len(train_images), seed=seed) if r.whiten_sample == "random"
                  else torch.arange(min(WHITENING_SAMPLE, len(train_images)))).to(train_images.device)
        init_whitening_conv(model.whiten, normalize(train_images[sample], *mean_std))
    elif r.whiten:
        model.whiten.weight.requires_grad_(False)  # frozen, as init_whitening_conv leaves it


def _start_epoch(model: nn.Module, r: Recipe, epoch: int) -> None:
    """The whitening bias trains only for the first epochs (airbench); its lr drops to 0
    then (``lr_lambdas``). Eager, also stop its gradient: that skips the first conv group's
    input gradient. Compiled, leave requires_grad alone: it is guarded, and flipping it
    would recompile mid-run, inside the clock."""
    if not r.compile:
        model.whiten.bias.requires_grad_(epoch < r.whiten_bias_epochs)
    model.train()


def _state(step: int, epoch: int, model, optimizer, scheduler, averaging: WeightAveraging, clock: Stopwatch,
           parts_before: list[float], result: RunResult) -> dict:
    """What ``train_run(resume=...)`` continues from, at an epoch's end."""
    return {"step": step, "epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "average": averaging.state_dict(),
            "rng": rng_state(), "time_s": clock.elapsed, "cpu_time_s": clock.cpu_elapsed,
            "time_parts_s": parts_before, "epochs": list(result.epochs),
            "epochs_to_target": result.epochs_to_target, "time_to_target_s": result.time_to_target_s}


def _restore(resume: dict, clock: Stopwatch, model, optimizer, scheduler, averaging: WeightAveraging,
             train_loader, result: RunResult) -> tuple[int, int]:
    """Load a ``_state`` into the run, outside the clock (restoring is the resume's cost, not
    the recipe's, as building the network is); returns (step, epoch)."""
    clock.stop()
    model.load_state_dict(resume["model"])
    optimizer.load_state_dict(resume["optimizer"])
    scheduler.load_state_dict(resume["scheduler"])
    averaging.load_state_dict(resume["average"])
    train_loader.epoch = resume["epoch"]  # each epoch's order and augmentation follow from (seed, epoch)
    set_rng_state(resume["rng"])
    result.epochs = list(resume["epochs"])
    result.epochs_to_target, result.time_to_target_s = resume["epochs_to_target"], resume["time_to_target_s"]
    clock.start()
    return resume["step"], resume["epoch"]


class WeightAveraging:
    """The recipe's weight average, updated after the step every ``r.ema_every`` steps:
    Lookahead on airbench's decay schedule, copied back into the model at the last step, or
    an EMA with a warm-up (Page), evaluated on the second network ``averaged``; or none."""

    def __init__(self, r: Recipe, model: nn.Module, averaged: nn.Module | None, total_steps: int) -> None:
        self.r, self.model, self.averaged, self.total_steps = r, model, averaged, total_steps
        self.decay_schedule = airbench_decay_schedule(total_steps)
        self.average: WeightAverage | None = None
        if r.averaging == "lookahead":
            self.average = Lookahead(model)
        elif r.averaging == "ema":
            self.average = WeightAverage(model)

    def after_step(self, s: Step) -> None:
        r = self.r
        if self.average is not None and s.number % r.ema_every == 0:
            if r.averaging == "lookahead":
                decay = self.decay_schedule[s.number].item()
            else:
                decay = warmup_decay(r.ema_decay, s.number // r.ema_every - 1)
            self.average.update(self.model, decay)
        if s.number >= self.total_steps and r.averaging == "lookahead":
            self.average.update(self.model, 1.0)

    def evaluated(self) -> nn.Module:
        """The network to evaluate: the model, or the second network holding the EMA."""
        if self.averaged is None:
            return self.model
        self.averaged.load_state_dict(self.model.state_dict())
        self.average.copy_to(self.averaged)
        return self.averaged

    def state_dict(self) -> dict | None:
        return self.average.state_dict() if self.average is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        if self.average is not None:
            self.average.load_state_dict(state)


class Validation:
    """The run's evaluations of ``averaging.evaluated()`` on the test set, in batches of 2,000.

    Untimed, at each epoch's end (:meth:`epoch_end`): without TTA every epoch when asked or
    for the target, else after the last only (on a CPU each pass costs a fifth of an epoch
    of training); with the recipe's TTA until ``target`` is reached; the first epoch and
    timed seconds at or above it go to ``result``. Timed, at the end (:meth:`final`): with
    the recipe's TTA."""

    def __init__(self, r: Recipe, test_x, test_y, averaging: WeightAveraging, bf16: bool, target: float | None,
                 every_epoch: bool, result: RunResult) -> None:
        self.r, self.test_x, self.test_y, self.averaging, self.bf16 = r, test_x, test_y, averaging, bf16
        self.target, self.every_epoch, self.result = target, every_epoch, result

    def batches(self):
        for i in range(0, len(self.test_y), 2000):
            yield self.test_x[i:i + 2000], self.test_y[i:i + 2000]

    def epoch_end(self, epoch: int, step: int, meter: TrainMeter, time_s: float, *, last: bool) -> dict:
        """The epoch's record (also appended to ``result.epochs``)."""
        r, result, target = self.r, self.result, self.target
        evaluated = self.averaging.evaluated()
        record = {"epoch": epoch, "epochs": math.ceil(r.epochs), "step": step, "train_loss": meter.loss,
                  "train_accuracy": meter.accuracy, "val_accuracy": None, "tta_accuracy": None, "time_s": time_s}
        if last or self.every_epoch or target is not None:
            record["val_accuracy"] = evaluate(evaluated, self.batches(), "none", bf16=self.bf16)
        if target is not None and result.epochs_to_target is None and r.tta != "none":
            record["tta_accuracy"] = evaluate(evaluated, self.batches(), r.tta, bf16=self.bf16)
        reached = record["tta_accuracy"] if record["tta_accuracy"] is not None else record["val_accuracy"]
        if target is not None and result.epochs_to_target is None and reached is not None and reached >= target:
            result.epochs_to_target = min(epoch, r.epochs)
            result.time_to_target_s = time_s
        result.epochs.append(record)
        return record

    def final(self, clock: Stopwatch, parts_before: list[float]) -> None:
        """Timed: the final evaluation with the recipe's TTA; then the result's accuracies and
        times, and the last epoch's record completed with them."""
        result = self.result
        clock.start()
        result.tta_accuracy = evaluate(self.averaging.evaluated(), self.batches(), self.r.tta, bf16=self.bf16)
        clock.stop()
        result.time_s = clock.elapsed
        result.cpu_time_s = clock.cpu_elapsed
        result.time_parts_s = [*parts_before, result.time_s - sum(parts_before)]
        result.accuracy = result.epochs[-1]["val_accuracy"]
        result.epochs[-1]["tta_accuracy"] = result.tta_accuracy
        result.epochs[-1]["time_s"] = result.time_s


WHITENING_SAMPLE = 5000  # images whose patch covariance sets the whitening layer (airbench)


def whitening_sample(n_images: int, *, seed: int, size: int = WHITENING_SAMPLE) -> torch.Tensor:
    """Indices of a seeded uniform random sample of ``size`` training images (all of
    them if there are fewer) for the whitening statistics.

    airbench takes the first 5,000 images, which is a random sample only because the
    canonical CIFAR-10 files are already shuffled; image folders and JPEG archives load
    in class order, where the first 5,000 are a single class."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n_images, generator=generator)[:size]
