"""The CIFAR-10 speedrun: the single-GPU bag of tricks, every trick switchable.

Lineage: David Page, "How to train your ResNet" (2018; 94% in 26 s on a V100
after the ladder in ``LADDER``), then Keller Jordan's airbench (2024; 94% in
3.3 s on an A100: 2x2 whitening, identity init, alternating flip, multi-crop TTA,
Lookahead). ``PRESETS['airbench94']`` is airbench94's hyperparameters; ``cpu`` is
a smaller net and schedule that finishes in minutes on a 2-core machine.

Timing follows the speedrun community: data already decoded (cached), a warm-up
run excluded, the device synchronised before every clock read; included are the
loader set-up (normalisation, padding on the device), the whitening set-up, every
training step and the final (TTA) evaluation; excluded is the per-epoch
validation that only feeds the progress table.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hasten.data.device_loader import Augmentation, GpuLoader, HostLoader, channel_stats, normalize
from hasten.models.speedrun_net import NetConfig, SpeedrunNet
from hasten.nn.ema import Lookahead, WeightAverage, airbench_decay_schedule, warmup_decay
from hasten.nn.tta import TTA_LEVELS, evaluate
from hasten.nn.whitening import init_whitening_conv
from hasten.progress import progress

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
    whiten_bias_epochs: int = 3       # the whitening bias trains this many epochs, then freezes
    augment: Augmentation = Augmentation(translate=2, flip="alternating")
    averaging: str = "lookahead"      # none | ema (evaluate the EMA) | lookahead (copy back)
    ema_every: int = 5                # steps between weight-average updates
    ema_decay: float = 0.99           # for averaging=ema (Page); lookahead uses airbench's schedule
    tta: str = "flip_translate"       # none | flip | flip_translate
    device_loader: bool = True        # False: per-batch preprocessing on the host (ladder rung 0)
    bf16: bool = True                 # autocast to bfloat16 on CUDA (batch norm stays fp32)
    channels_last: bool = True
    compile: bool = False             # torch.compile the model (CUDA; excluded from timing by warm-up)

    def __post_init__(self) -> None:
        if self.averaging not in ("none", "ema", "lookahead"):
            raise ValueError(f"Invalid averaging {self.averaging!r}; accepted: none, ema, lookahead")
        if self.tta not in TTA_LEVELS:
            raise ValueError(f"Invalid tta {self.tta!r}; accepted: {', '.join(TTA_LEVELS)}")
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs, batch_size and lr must be positive: {self.epochs}, {self.batch_size}, {self.lr}")

    def replace(self, **changes) -> "Recipe":
        net_changes = {k[4:]: changes.pop(k) for k in list(changes) if k.startswith("net.")}
        return dataclasses.replace(self, net=dataclasses.replace(self.net, **net_changes), **changes)


PRESETS: dict[str, Recipe] = {
    # airbench94 (Keller Jordan): 94.0% on canonical CIFAR-10 in 3.83 s on an A100.
    "airbench94": Recipe(),
    # CPU: a quarter of the width, fewer epochs; about 6-8 minutes on 2 cores.
    "cpu": Recipe(net=NetConfig(widths=(32, 64, 128)), epochs=8, batch_size=512, lr=9.0),
    # A seconds-long preset for tests and smoke runs.
    "tiny": Recipe(net=NetConfig(widths=(16, 32, 32)), epochs=2, batch_size=256, lr=6.0,
                   whiten_bias_epochs=1, tta="flip"),
}

# Page's ladder (each rung adds one trick to the previous one), then airbench's
# additions. Rung 0 is the plain net: host-side preprocessing, ReLU, pool after
# activation, no label smoothing, trainable BN scales, no whitening, no weight
# averaging, no TTA, random flips, default init.
BASELINE_CHANGES = {
    "device_loader": False, "net.pool_before_act": False, "label_smoothing": 0.0,
    "net.activation": "relu", "net.ghost_bn_splits": 1, "net.freeze_bn_scale": False,
    "bias_scaler": 1.0, "whiten": False, "averaging": "none", "tta": "none",
    "augment": Augmentation(translate=2, flip="random"), "net.dirac_init": False,
}
LADDER: list[tuple[str, dict]] = [
    ("baseline", {}),
    ("+ preprocessing on the device", {"device_loader": True}),
    ("+ max-pool before activation", {"net.pool_before_act": True}),
    ("+ label smoothing 0.2", {"label_smoothing": 0.2}),
    ("+ CELU", {"net.activation": "celu"}),
    ("+ ghost batch norm (32/chunk)", {"net.ghost_bn_splits": "batch/32"}),
    ("+ frozen BN scale, bias lr x64", {"net.freeze_bn_scale": True, "bias_scaler": 64.0}),
    ("+ patch whitening", {"whiten": True}),
    ("+ EMA of weights", {"averaging": "ema"}),
    ("+ TTA: flip", {"tta": "flip"}),
    ("+ alternating flip", {"augment": "alternating"}),
    ("+ identity (dirac) init", {"net.dirac_init": True}),
    ("+ GELU, Lookahead (airbench)", {"net.activation": "gelu", "net.ghost_bn_splits": 1, "averaging": "lookahead"}),
    ("+ TTA: flip + translate", {"tta": "flip_translate"}),
]


def ladder_recipes(top: Recipe) -> list[tuple[str, Recipe]]:
    """The cumulative rungs, each a full Recipe, ending in ``top`` with all tricks on."""
    recipe = top.replace(**BASELINE_CHANGES)
    rungs = []
    for name, changes in LADDER:
        changes = dict(changes)
        if changes.get("net.ghost_bn_splits") == "batch/32":
            changes["net.ghost_bn_splits"] = max(1, recipe.batch_size // 32)
        if changes.get("augment") == "alternating":
            changes["augment"] = dataclasses.replace(recipe.augment, flip="alternating")
        recipe = recipe.replace(**changes)
        rungs.append((name, recipe))
    return rungs


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------


def make_optimizer(model: nn.Module, r: Recipe) -> torch.optim.Optimizer:
    """Nesterov SGD with airbench's scaling: the summed loss and ``lr`` per 1024
    examples are turned into PyTorch's per-step lr, weight decay is decoupled from
    the lr (applied as wd/lr so lr*wd stays fixed), BN biases get ``bias_scaler`` x lr."""
    kilostep_scale = 1024 * (1 + 1 / (1 - r.momentum))
    lr = r.lr / kilostep_scale
    wd = r.weight_decay * r.batch_size / kilostep_scale
    norm_biases = [p for n, p in model.named_parameters() if "norm" in n and p.requires_grad]
    others = [p for n, p in model.named_parameters() if "norm" not in n and p.requires_grad]
    groups = [dict(params=norm_biases, lr=lr * r.bias_scaler, weight_decay=wd / (lr * r.bias_scaler)),
              dict(params=others, lr=lr, weight_decay=wd / lr)]
    return torch.optim.SGD(groups, momentum=r.momentum, nesterov=True)


def lr_factor(step: int, total: int, warmup_frac: float) -> float:
    """airbench's triangle: 0.2 -> 1.0 linearly over the warm-up, then -> 0.07."""
    warmup = int(total * warmup_frac)
    if step < warmup:
        return 0.2 + 0.8 * step / warmup
    return 1.0 + (0.07 - 1.0) * (step - warmup) / max(total - warmup, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RunResult:
    accuracy: float                  # final accuracy without TTA
    tta_accuracy: float              # final accuracy with the recipe's TTA (the headline number)
    time_s: float                    # timed span, see the module docstring
    cpu_time_s: float = 0.0          # process CPU seconds over the same span (all threads)
    epochs: list[dict] = field(default_factory=list)
    epochs_to_target: float | None = None
    time_to_target_s: float | None = None


def train_run(recipe: Recipe, data, device: torch.device, *, seed: int = 0, target: float | None = None,
              on_epoch: Callable[[dict], None] | None = None, max_steps: int | None = None,
              mean_std: tuple[list[float], list[float]] | None = None) -> RunResult:
    """Train and evaluate one run of ``recipe`` on ``data`` (an ImageDataset).

    ``target``: also record the first epoch (and timed seconds) at which validation
    accuracy (with the recipe's TTA) reaches it; that costs a TTA evaluation per
    epoch, which is not timed. ``max_steps``: stop early (warm-up runs).
    ``mean_std``: per-channel normalisation (a property of the data set: compute it
    once with ``channel_stats`` and pass it to every run)."""
    r = recipe
    torch.manual_seed(seed)
    use_bf16 = r.bf16 and device.type == "cuda"
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    autocast = torch.bfloat16 if use_bf16 else None
    memory_format = torch.channels_last if r.channels_last else torch.contiguous_format
    mean, std = mean_std if mean_std is not None else channel_stats(data.train.images)

    synchronize(device)
    clock = Stopwatch()
    clock.start()
    loader_cls = GpuLoader if r.device_loader else HostLoader
    train_loader = loader_cls(data.train.images, data.train.labels, r.batch_size, device=device, augment=r.augment,
                              mean=mean, std=std, dtype=dtype, channels_last=r.channels_last, seed=seed)
    test_x = normalize(data.test.images.to(device), mean, std, dtype).contiguous(memory_format=memory_format)
    test_y = data.test.labels.to(device)

    model = SpeedrunNet(r.net).to(device=device, memory_format=memory_format)
    if r.whiten:
        init_whitening_conv(model.whiten, normalize(data.train.images[:5000].to(device), mean, std))
    optimizer = make_optimizer(model, r)
    total_steps = math.ceil(len(train_loader) * r.epochs)
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, r.warmup_frac))
    decay_schedule = airbench_decay_schedule(total_steps)
    average: WeightAverage | None = None
    if r.averaging == "lookahead":
        average = Lookahead(model)
    elif r.averaging == "ema":
        average = WeightAverage(model)
    step_model = torch.compile(model) if r.compile else model

    def eval_batches():
        for i in range(0, len(test_y), 2000):
            yield test_x[i:i + 2000], test_y[i:i + 2000]

    def eval_model() -> nn.Module:
        if r.averaging != "ema":
            return model
        averaged = SpeedrunNet(r.net).to(device=device, memory_format=memory_format)
        averaged.load_state_dict(model.state_dict())
        average.copy_to(averaged)
        return averaged

    result = RunResult(accuracy=0.0, tta_accuracy=0.0, time_s=0.0)
    step, epoch = 0, 0
    while step < total_steps:
        # The whitening bias trains only for the first epochs (airbench).
        model.whiten.bias.requires_grad_(epoch < r.whiten_bias_epochs)
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        seen = 0
        bar = progress(total=min(len(train_loader), total_steps - step), desc=f"epoch {epoch + 1}")
        for x, y in train_loader:
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                logits = step_model(x)
                loss = F.cross_entropy(logits.float(), y, label_smoothing=r.label_smoothing, reduction="sum")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            # Accumulate on the device: reading .item() here would sync every step.
            loss_sum += loss.detach()
            correct += (logits.detach().argmax(1) == y).sum()
            seen += len(y)
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
        synchronize(device)
        clock.stop()
        # Untimed: per-epoch validation for the table (and the target, if asked).
        evaluated = eval_model()
        record = {"epoch": epoch, "train_loss": float(loss_sum) / max(seen, 1),
                  "train_accuracy": float(correct) / max(seen, 1),
                  "val_accuracy": evaluate(evaluated, eval_batches(), "none", autocast),
                  "tta_accuracy": None, "time_s": clock.elapsed}
        if target is not None and result.epochs_to_target is None and r.tta != "none":
            record["tta_accuracy"] = evaluate(evaluated, eval_batches(), r.tta, autocast)
        reached = record["tta_accuracy"] if record["tta_accuracy"] is not None else record["val_accuracy"]
        if target is not None and result.epochs_to_target is None and reached >= target:
            result.epochs_to_target = min(epoch, r.epochs)
            result.time_to_target_s = clock.elapsed
        result.epochs.append(record)
        if step < total_steps:
            if on_epoch is not None:
                on_epoch(record)
            clock.start()

    # Timed: the final evaluation with the recipe's TTA.
    clock.start()
    evaluated = eval_model()
    result.tta_accuracy = evaluate(evaluated, eval_batches(), r.tta, autocast)
    synchronize(device)
    clock.stop()
    result.time_s = clock.elapsed
    result.cpu_time_s = clock.cpu_elapsed
    result.accuracy = result.epochs[-1]["val_accuracy"]
    result.epochs[-1]["tta_accuracy"] = result.tta_accuracy
    result.epochs[-1]["time_s"] = result.time_s
    if on_epoch is not None:
        on_epoch(result.epochs[-1])
    return result


class Stopwatch:
    """Accumulates wall time, and this process's CPU time, over start/stop spans
    (callers synchronise the device first). CPU time is the steadier number on a
    shared machine: other jobs stretch wall time, not our CPU seconds."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.cpu_elapsed = 0.0
        self._t0: tuple[float, float] | None = None

    def start(self) -> None:
        self._t0 = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        if self._t0 is not None:
            self.elapsed += time.perf_counter() - self._t0[0]
            self.cpu_elapsed += time.process_time() - self._t0[1]
            self._t0 = None


def flops_per_run(recipe: Recipe, data, device: torch.device) -> int:
    """Training plus final-evaluation FLOPs of one run (torch.utils.flop_counter),
    counted on a 2-image batch and scaled: convolution and matmul FLOPs only."""
    from torch.utils.flop_counter import FlopCounterMode

    model = SpeedrunNet(recipe.net)
    x = torch.zeros(2, 3, *data.train.images.shape[-2:])
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    train_per_example = counter.get_total_flops() / 2
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    forward_per_example = counter.get_total_flops() / 2
    steps = math.ceil(len(data.train.labels) // recipe.batch_size * recipe.epochs)
    views = {"none": 1, "flip": 2, "flip_translate": 6}[recipe.tta]
    return int(train_per_example * steps * recipe.batch_size + forward_per_example * views * len(data.test.labels))
