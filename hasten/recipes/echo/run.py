"""Data echoing recipe: train to a target accuracy through the streaming pipeline.

Reproduces the setting of Choi et al., "Faster Neural Network Training with Data
Echoing" (2019, arXiv:1907.05550): an input pipeline slower than the training
step (here: simulated slow storage, R = upstream time / step time), an echo stage
after it, and the question how many fresh examples, steps and seconds it takes
to reach a fixed accuracy. Everything is real: JPEGs are read from the data
(an image folder or archive, packed shards, or their URL: ``hasten.stream.sources.open_source``)
behind ``SlowStorage``, decoded (at 16x16 on CPU by DCT downscaling) in
``hasten.stream.shard_loader.ShardLoader``, echoed, augmented and shuffled in
``hasten.stream.echo_stage.EchoStage``, and trained on; accuracy is measured on
held-out test images.

On CUDA the network runs in channels_last memory format under bf16 autocast (batch
norm and the loss in float32: ``hasten.nn.precision``), as the speedrun and train
recipes do; on the CPU in float32, NCHW.

Timing: the training loop's clock (two ``hasten.timing.Stopwatch``: waiting for
input, and the steps) stops during evaluations, and so does the slow storage
(``SlowStorage.paused``), so an evaluation gives no run free upstream time.
The comparison with no echoing is ``hasten.recipes.echo.compare``; the sweeps in the
paper's regime are ``hasten.recipes.echo.sweep``.

Changes the training math: yes with echoing (repeated examples); e = 1 is plain
streaming training.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import count

import numpy as np
import torch
from torch import nn

from hasten.data.normalize import normalize
from hasten.echo import AutoEcho, check_factor, check_variant, default_shuffle_buffer, warn_if_small_buffer
from hasten.errors import ConfigError, DataError
from hasten.nn.precision import batchnorm_in_float32, cross_entropy
from hasten.nn.tta import evaluate
from hasten.recipes.echo.eval_set import EvalSet
from hasten.recipes.echo.loop_hooks import InputClock, RepeatValue, paused
from hasten.recipes.echo.network import MEAN, STD, SmallNet, fast_formats, mean_std_on  # noqa: F401 (handed on)
from hasten.recipes.loop import train_loop
from hasten.stream.echo_stage import EchoStage
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.slow_storage import SlowStorage
from hasten.stream.sources import open_source


# ----------------------------------------------------------------------------- Hyperparameters
@dataclass(frozen=True)
class EchoRunConfig:
    """One run: data, echoing, simulated storage, and the training hyperparameters.

    The hyperparameter defaults are the CPU preset: a small network on 16x16 images
    that reaches the target in about ten seconds of compute on two shared cores.
    ``EchoRunConfig.for_device("cuda", ...)`` starts from the GPU preset instead.
    Change a config with ``dataclasses.replace``.
    """
    data: str
    variant: str = "example-before"
    echo: float | str = 1.0  # a factor >= 1 or "auto" (AutoEcho)
    upstream_delay_s: float = 0.0  # slow storage's time per example read (shared by all decode workers)
    e_max: float = 8.0  # AutoEcho's largest factor
    seed: int = 0
    device: str = "cpu"
    workers: int = 0  # decode processes; 0 = a decode thread (decoding is cheap next to the delay)
    image_size: int = 16  # decoded at 1/2 DCT scale: a quarter of the pixels to decode and train on
    width: int = 16  # SmallNet's first conv channels, doubled at each of the next two; 0 = the speedrun net
    batch_size: int = 64
    lr: float = 0.05  # SGD, Nesterov momentum 0.9; constant: runs of different length stay comparable
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    target: float = 0.40  # test accuracy; reached in about 8k fresh examples without echoing
    eval_every: int = 10  # steps between evaluations
    eval_images: int = 1000  # test images used to detect the target (the full test set at the end)
    max_fresh: int = 40_000  # give up after this many fresh examples
    # Examples (batches, for batch echoing) mixed after the echo stage; None: sized from e
    # (e_max for AutoEcho) and the batch by hasten.echo.default_shuffle_buffer, ~1% duplicates.
    shuffle_buffer: int | None = None
    # AutoEcho measures what a repeat is worth on this task every this many steps
    # at first, less often once it stands (hasten.echo.repeat_value; 3/8 of a step's
    # forward and backward each time); 0: its constant.
    value_every: int = 8

    def __post_init__(self) -> None:
        try:
            check_variant(self.variant)
            object.__setattr__(self, "echo", parse_echo(self.echo))
        except ValueError as exc:  # one line for the user, not a traceback
            raise ConfigError(str(exc)) from None
        if not (math.isfinite(self.upstream_delay_s) and self.upstream_delay_s >= 0):
            raise ConfigError(f"upstream delay must be >= 0 seconds; got {self.upstream_delay_s}")
        if not 0 < self.target < 1:
            raise ConfigError(f"target accuracy must be in (0, 1); got {self.target}")
        if not isinstance(self.value_every, int) or isinstance(self.value_every, bool) or self.value_every < 0:
            raise ConfigError(f"value_every must be an integer >= 0 (steps; 0: AutoEcho's constant repeat value); "
                              f"got {self.value_every!r}")
        if self.batch_size < 1 or self.eval_every < 1 or self.max_fresh < 1:
            raise ConfigError(f"batch_size, eval_every and max_fresh must be >= 1; got "
                              f"{self.batch_size}, {self.eval_every}, {self.max_fresh}")

    @classmethod
    def for_device(cls, device: torch.device | str, **fields) -> EchoRunConfig:
        """The preset for ``device`` (GPU_PRESET on CUDA, else the CPU defaults) with ``fields``."""
        preset = GPU_PRESET if torch.device(device).type == "cuda" else {}
        return cls(**{**preset, "device": str(device), **fields})


# GPU: the speedrun network on 32x32 images, to a CIFAR-10 accuracy worth reaching.
GPU_PRESET = {
    "image_size": 32, "width": 0, "batch_size": 512, "lr": 0.2, "weight_decay": 5e-4, "label_smoothing": 0.2,
    "target": 0.85, "eval_every": 20, "eval_images": 10_000, "max_fresh": 500_000,
}


def parse_echo(value) -> float | str:
    """``"auto"`` or a number >= 1 (ValueError naming the accepted values otherwise)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        factor = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"echo factor must be 'auto' or a number >= 1; got {value!r}") from None
    return float(check_factor(factor))


def make_model(cfg: EchoRunConfig, num_classes: int) -> nn.Module:
    if cfg.width:
        return SmallNet(cfg.width, num_classes)
    from hasten.models.speedrun_net import NetConfig, SpeedrunNet

    return SpeedrunNet(NetConfig(num_classes=num_classes))


# ----------------------------------------------------------------------------- Training
def measure_step_time(cfg: EchoRunConfig, steps: int = 40, *, warmup: int = 5,
                      eval_set: EvalSet | None = None) -> float:
    """Seconds per training step of ``cfg`` without storage delay or echoing: a short
    run of the real loop, so that a delay of R * step / batch per example gives about R.
    The first ``warmup`` steps are run but not timed: they hold first-use costs (cuDNN's
    autotuning, the allocator's growth, lazy initialisation) that later steps do not
    pay, and would make the step look slower and so R, set from it, larger."""
    probe = replace(cfg, echo=1.0, upstream_delay_s=0.0, target=0.999, max_fresh=(warmup + steps) * cfg.batch_size)
    return train_to_target(probe, eval_set=eval_set, untimed_steps=warmup)["step_time_s"]


def shuffle_size(cfg: EchoRunConfig) -> int | None:
    """The shuffle buffer after the echo stage: ``cfg.shuffle_buffer``, by default sized
    for e so that ~1% of a batch are repeated copies; a warning when a given size
    leaves many more. With AutoEcho by default None: ``EchoStage`` then sizes the
    buffer for the current e (``hasten.echo.auto_shuffle_buffer``). A fixed buffer sized
    for ``e_max`` held back 1,400 fresh examples before the first step, and AutoEcho
    read that fill as R = 541 and stayed at ``e_max`` at R 3.5 (issue 34). Batch echoing
    mixes whole batches (copies never share a batch): its buffer counts batches, 0 by default."""
    e = cfg.e_max if cfg.echo == "auto" else float(cfg.echo)
    if cfg.variant == "batch":
        return cfg.shuffle_buffer // cfg.batch_size if cfg.shuffle_buffer else 0
    if cfg.shuffle_buffer is None and cfg.echo == "auto":
        return None
    if cfg.shuffle_buffer is None:
        return default_shuffle_buffer(e, cfg.batch_size) if e > 1 else 0
    warn_if_small_buffer(cfg.shuffle_buffer, e, cfg.batch_size)
    return cfg.shuffle_buffer


def train_to_target(cfg: EchoRunConfig, *, eval_set: EvalSet | None = None, log=None, untimed_steps: int = 0) -> dict:
    """Train until the test accuracy reaches the target; return the run's measurements.
    ``step_time_s`` leaves out the first ``untimed_steps`` steps (measure_step_time)."""
    dev = torch.device(cfg.device)
    # Virtual shards of one batch (a folder or archive; packed shards keep their own): the slow
    # storage below then hands over a batch's examples at a time, not a burst of 256.
    store = open_source(cfg.data, "train", per_shard=cfg.batch_size)
    if eval_set is None:
        eval_set = EvalSet.of(cfg.data, cfg.image_size, dev)
    # The delay is the storage's time per example, whatever the number of readers: shards read
    # ahead at once queue on its one link instead of each getting the full rate (a per-request
    # latency would be hidden as many times over as there are reads in flight).
    storage = SlowStorage(store, item_s=cfg.upstream_delay_s, items_of=store.examples.__getitem__)
    auto = (AutoEcho(e_max=cfg.e_max, interval=4 * cfg.batch_size, value_every=cfg.value_every)
            if cfg.echo == "auto" else None)
    if auto is not None and cfg.variant == "batch":
        auto.interval = 4
    # The CIFAR augmentation (the whole image at image_size, a random crop of it padded by 4,
    # a flip), which example-before echoing applies to each copy after the echo stage.
    shards = ShardLoader(storage, batch_size=cfg.batch_size, image_size=cfg.image_size, seed=cfg.seed,
                         workers=cfg.workers, prefetch=4, crop="pad-crop", device=dev)
    loader = EchoStage(shards, auto if auto is not None else cfg.echo, variant=cfg.variant,
                       shuffle_buffer=shuffle_size(cfg), with_copies=True)
    torch.manual_seed(cfg.seed)
    memory_format, bf16 = fast_formats(dev)
    model = make_model(cfg, len(store.classes)).to(dev, memory_format=memory_format)
    if bf16:
        batchnorm_in_float32(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, nesterov=True,
                          weight_decay=cfg.weight_decay)
    clock = InputClock(dev)  # the run's clock is its waiting and stepping
    # What a repeat is worth, measured on this task (hasten.echo.repeat_value) instead of
    # AutoEcho's constant; batch echoing puts no repeat beside its first copy, so not there.
    value = RepeatValue(auto, cfg.variant, model, partial(cross_entropy, label_smoothing=cfg.label_smoothing),
                        cfg.seed, device=dev, bf16=bf16)
    reached, factors, untimed_s = False, [], 0.0  # untimed_s: step time of the first untimed_steps steps

    def loss_fn(logits, y):  # per example when AutoEcho reads what repeats are worth
        return cross_entropy(logits, y, label_smoothing=cfg.label_smoothing, reduction="none" if value.on else "mean")

    def after_step(s) -> bool:
        nonlocal untimed_s, reached
        value.observe(s.loss, s.extra[0])  # repeats memorised: the cap on e comes down
        stepped = clock.stepping.stop()
        if s.number <= untimed_steps:
            untimed_s += stepped
        factors.append(auto.factor if auto is not None else cfg.echo)
        if s.number % cfg.eval_every == 0:
            with paused(storage, auto):  # neither the storage nor AutoEcho's measurement runs on meanwhile
                accuracy = evaluate(model, eval_set.batches(cfg.eval_images))
            if log is not None:
                log(step=s.number, fresh=loader.counters.fresh_examples, accuracy=accuracy, wall_s=clock.wall_s,
                    echo=factors[-1])
            if accuracy >= cfg.target:
                reached = True
                return True
        return loader.counters.fresh_examples >= cfg.max_fresh

    steps = train_loop(model, opt, _device_batches(cfg, store, loader, clock, dev, memory_format), loss_fn,
                       device=dev, bf16=bf16, after_step=after_step,
                       # what a repeat is worth, at the step's weights, before its forward
                       before_forward=(lambda s: value.probe(s.x, s.y, s.extra[0])) if value.on else None)
    wait_s, step_s = clock.waiting.elapsed, clock.stepping.elapsed
    c = loader.counters
    # The storage's time per batch over step time: the part of R the slow storage adds (decoding adds
    # more), from the reads of every process (the decode workers read through the shared storage).
    storage_ratio = (storage.link_busy_s / max(storage.items, 1)) * cfg.batch_size / (step_s / max(steps, 1))
    return {
        "variant": cfg.variant,
        "echo_factor": cfg.echo,
        "mean_echo_factor": float(np.mean(factors)) if factors else 1.0,
        "upstream_delay_s": cfg.upstream_delay_s,
        # Without echoing, an input-bound loop runs at the upstream's pace: (wait + step) / step
        # is R = upstream time / step time, measured. It reads ~1 when the loop is not input-bound.
        "upstream_ratio": (wait_s + step_s) / step_s if cfg.echo == 1.0 and step_s > 0 else None,
        "storage_ratio": storage_ratio,
        "reached_target": reached,
        "target": cfg.target,
        "fresh_examples_to_target": c.fresh_examples if reached else None,
        "steps_to_target": steps if reached else None,
        "wall_time_to_target_s": wait_s + step_s if reached else None,
        "fresh_examples": c.fresh_examples,
        "steps": steps,
        "wall_time_s": wait_s + step_s,
        "final_accuracy": evaluate(model, eval_set.batches()),
        "idle_fraction": wait_s / (wait_s + step_s) if steps else 0.0,
        "step_time_s": (step_s - untimed_s) / max(steps - min(steps, untimed_steps), 1),
        "duplicate_rate": c.duplicate_rate,
        "repeat_value_measured": auto.value_history if auto is not None else None,
        "autoecho_cap": auto.cap if auto is not None else None,
        "skipped_images": len(loader.skipped),
        "seed": cfg.seed,
        "config": asdict(cfg),
    }


def _device_batches(cfg: EchoRunConfig, store, loader: EchoStage, clock: InputClock, dev, memory_format):
    """The stage's batches on the device, normalised, epoch after epoch, with each item's copy
    number; fetching one is waiting, and from then on the step is stepping (until its end)."""
    mean, std = mean_std_on(dev)
    channels_last = memory_format == torch.channels_last
    for epoch in count():
        loader.set_epoch(epoch)
        it = iter(loader)
        batches = 0
        try:
            while True:
                clock.waiting.start()
                batch = next(it, None)
                clock.waiting.stop()
                if batch is None:
                    if batches == 0:  # else the next epoch would be as empty, forever
                        raise DataError(f"{cfg.data}: an epoch gave no training batch: {sum(store.examples)} "
                                        f"training image(s), {len(loader.skipped)} of them unreadable, batches "
                                        f"of {cfg.batch_size}")
                    break
                clock.stepping.start()
                x, y, copies = batch
                batches += 1
                yield normalize(x.to(dev, non_blocking=True), mean, std, channels_last=channels_last), y.to(dev), copies
        finally:
            it.close()
