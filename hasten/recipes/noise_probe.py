"""The gradient noise scale during ``hasten train`` (``--noise-scale``; McCandlish et al.,
"An Empirical Model of Large-Batch Training", arXiv:1812.06162; ``hasten.optim.noise_scale``):
on one process a probe every ``NOISE_PROBE_EVERY`` steps, its metrics and its report with
the batch it suggests. Under DDP the all-reduce hook measures it (``wrap_ddp``).
``NoiseProbe`` holds both as the hooks of ``hasten.recipes.loop.train_loop``, timed.

Used by ``hasten.recipes.train``. Changes the training math: no (the probe's gradients
are its own; the step's are untouched).
"""

from __future__ import annotations

import math

import torch

from hasten.nn.precision import autocast, cross_entropy
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms, suggest_batch
from hasten.recipes.loop import Step
from hasten.recipes.train_config import TrainConfig
from hasten.timing import Stopwatch

# One process measures the noise scale on a probe every this many steps (an extra forward
# and backward of the batch as micro-batches, about 1/NOISE_PROBE_EVERY of the training
# time); under DDP every step is measured, from gradients the step computes anyway.
NOISE_PROBE_EVERY = 10


def noise_probe_step(model, noise: NoiseScale, x, y, micro: int, cfg: TrainConfig, device, step: int) -> None:
    """One process: the squared gradient norms of the batch's micro-batches of ``micro``
    images and of their mean, at the parameters this step starts from; training untouched."""
    def loss_fn(logits, labels):
        return cross_entropy(logits, labels, cfg.label_smoothing)

    class _Autocast(torch.nn.Module):  # the forward as training runs it (bf16 autocast or not)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, inp):
            with autocast(device, cfg.bf16):
                return self.inner(inp)

    small, big = micro_batch_sq_norms(_Autocast(model), loss_fn, list(zip(x.split(micro), y.split(micro))))
    noise.update(small, big, micro, len(x), step)


def noise_metrics(noise: NoiseScale) -> dict:
    return {"noise_scale": noise.b_simple, "noise_grad_sq": noise.g2, "noise_trace": noise.trace}


def noise_report(noise: NoiseScale, cfg: TrainConfig, world: int, local_batch: int, micro: int,
                  seconds: float, train_time: float) -> dict:
    """The estimate, how it was measured, what it costs, and the batch it suggests."""
    window = noise.b_simple_window  # the whole run: late in a decayed run |G|^2 -> 0 and the ratio explodes
    value = window if math.isfinite(window) else noise.b_simple
    suggested, why = suggest_batch(value, cfg.batch_size)
    if world > 1:
        how = (f"every step: each rank's gradient over its {local_batch} images (before the all-reduce) and the "
               f"averaged one over {cfg.batch_size}")
        b_small, b_big = local_batch, cfg.batch_size
    else:
        how = (f"every {NOISE_PROBE_EVERY} steps: micro-batches of {micro} images of the step's batch and their mean "
               f"over {local_batch}")
        b_small, b_big = micro, local_batch
    return {"b_simple": noise.b_simple, "b_simple_run": window, "used": value,
            "measurements": noise.updates, "b_small": b_small, "b_big": b_big, "how": how,
            "seconds": seconds, "overhead_fraction": seconds / train_time if train_time > 0 else math.nan,
            "suggested_batch": suggested, "why": why}


class NoiseProbe:
    """The noise scale ``noise`` (None: not measured) as a run measures it, with the seconds
    it costs: on one process ``before_backward`` probes every ``NOISE_PROBE_EVERY`` steps at
    the weights the step starts from (``micro``: the probe's micro-batch, 0 when there is no
    probe); under DDP ``after_step`` records what the all-reduce hook measured."""

    def __init__(self, noise: NoiseScale | None, model, ddp, cfg: TrainConfig, device, world: int,
                 local_batch: int) -> None:
        self.noise, self.model, self.ddp, self.cfg, self.device, self.world = noise, model, ddp, cfg, device, world
        self.local_batch = local_batch
        self.micro = (cfg.ghost_batch or local_batch // 2) if noise is not None and world == 1 else 0
        self.clock = Stopwatch(device)

    def before_backward(self, s: Step) -> None:
        if s.number % NOISE_PROBE_EVERY == 0:
            self.clock.start()
            noise_probe_step(self.model, self.noise, s.x, s.y, self.micro, self.cfg, self.device, s.number)
            self.clock.stop()

    def after_step(self, s: Step) -> None:
        if self.noise is not None and self.world > 1:
            self.clock.start()
            self.ddp.noise_scale.update(s.number)
            self.clock.stop()

    def metrics(self) -> dict:
        return noise_metrics(self.noise) if self.noise is not None else {}

    def report(self, train_time: float) -> dict:
        """``noise_report`` of this session's probes (those before a resume were timed by that session)."""
        return noise_report(self.noise, self.cfg, self.world, self.local_batch, self.micro, self.clock.elapsed,
                            train_time)
