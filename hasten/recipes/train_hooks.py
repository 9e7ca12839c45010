"""What a ``hasten train`` run does around its steps (``hasten.recipes.train``, through the
hooks of ``hasten.recipes.loop.train_loop``): its clock, which keeps the seconds of the steps
before a resume (``RunClock``); the metrics line at each epoch's end (``EpochMetrics``);
and its checkpoints (``Checkpoints``: every N steps and at the end, which
``hasten.recipes.train_resume.restore`` takes up).

Changes the training math: no (they read the run; a checkpoint holds what a resume needs
to continue with the very same steps).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

import torch

from hasten.checkpoint import CHECKPOINT_NAME, rng_state, save_checkpoint
from hasten.recipes.loop import Step
from hasten.recipes.step import TrainMeter
from hasten.timing import Stopwatch

__all__ = ["Checkpoints", "EpochMetrics", "RunClock"]


class RunClock:
    """The run's training seconds, those before a resume included when its checkpoint
    kept them (``earlier_s``; None: a fresh run, or an older checkpoint)."""

    def __init__(self, device, earlier_s: float | None, start_step: int) -> None:
        self.watch = Stopwatch(device)
        self.earlier_s = earlier_s
        # Rates count the steps the clock timed: all of them when the earlier time is known.
        self.base_step, self.base_s = (0, earlier_s) if earlier_s is not None else (start_step, 0.0)

    @property
    def seconds(self) -> float:
        """The timed seconds: this session's, and the earlier ones when known."""
        return self.base_s + self.watch.elapsed

    @property
    def of_all_steps(self) -> bool:
        """Whether the seconds cover every step (False: resumed from a checkpoint that did not
        keep the time before it, so they cover this session's steps only)."""
        return self.base_step == 0

    def images_per_s(self, step: int, batch: int) -> float:
        return (step - self.base_step) * batch / self.seconds

    def so_far(self) -> float | None:
        """Every training second until now, the current span included (the clock goes on);
        None when the seconds before a resume are unknown."""
        if self.watch.running:
            self.watch.stop()
            self.watch.start()
        return (self.earlier_s or 0.0) + self.watch.elapsed if self.of_all_steps else None


class EpochMetrics:
    """After each step, the training loss and accuracy summed on the device; at each epoch's
    end and at the last step, one metrics line in ``run_dir`` (None: no line, as on ranks
    other than 0): loss, accuracy, lr, seconds, images per second and the noise scale's
    ``extra()``. Untimed, and the meter syncs with the device: once per epoch, not per step."""

    def __init__(self, run_dir, clock: RunClock, scheduler, batch: int, steps_per_epoch: int, total_steps: int,
                 device, extra: Callable[[], dict]) -> None:
        self.run_dir, self.clock, self.scheduler, self.extra = run_dir, clock, scheduler, extra
        self.batch, self.steps_per_epoch, self.total_steps = batch, steps_per_epoch, total_steps
        self.meter = TrainMeter(device)

    def after_step(self, s: Step) -> None:
        self.meter.update(s.loss * len(s.y), s.logits, s.y)
        step = s.number
        if self.run_dir is not None and (step % self.steps_per_epoch == 0 or step == self.total_steps):
            self.clock.watch.stop()
            self.run_dir.log(step=step, epoch=step / self.steps_per_epoch, loss=self.meter.loss,
                             train_accuracy=self.meter.accuracy, lr=self.scheduler.get_last_lr()[0],
                             time_s=self.clock.seconds, images_per_s=self.clock.images_per_s(step, self.batch),
                             **self.extra())
            self.meter.reset()
            self.clock.watch.start()


class Checkpoints:
    """The run's checkpoint, written atomically by rank 0 into ``run_dir`` (None: this rank
    writes none) with the one before kept as ``checkpoint-previous.pt``: configuration, step,
    model, optimizer, schedule, random state, training seconds, every rank's loader
    position (a collective: every rank calls :meth:`save`) and the noise scale's state."""

    def __init__(self, cfg, run_dir, world: int, steps_per_epoch: int, model, optimizer, scheduler, position,
                 noise, clock: RunClock) -> None:
        self.cfg, self.run_dir, self.world, self.steps_per_epoch = cfg, run_dir, world, steps_per_epoch
        self.model, self.optimizer, self.scheduler, self.position = model, optimizer, scheduler, position
        self.noise, self.clock = noise, clock
        self.saved_at = None  # the step this run last saved a checkpoint at

    def every(self, s: Step) -> None:
        """Every ``cfg.checkpoint_every`` steps (0: only at the end)."""
        if self.cfg.checkpoint_every and s.number % self.cfg.checkpoint_every == 0:
            self.save(s.number)

    def save(self, step: int) -> None:
        if self.saved_at == step:
            return  # saved at this step already: keep the one before as checkpoint-previous.pt
        self.saved_at = step
        elapsed = self.clock.so_far()  # unknown when resumed from a checkpoint without the time before it
        positions = None
        if self.position is not None:
            # Each rank's loader has its own position: rank 0 stores them all.
            positions = [self.position.state_dict()]
            if self.world > 1:
                positions = [None] * self.world
                torch.distributed.all_gather_object(positions, self.position.state_dict())
        if self.run_dir is not None:
            save_checkpoint(self.run_dir.path / CHECKPOINT_NAME, {
                "config": asdict(self.cfg), "step": step, "epoch": step // self.steps_per_epoch,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rng_state(),
                **({"train_time_s": elapsed} if elapsed is not None else {}),
                **({"data": {"world_size": self.world, "ranks": positions}} if positions is not None else {}),
                **({"noise_scale": self.noise.state_dict()} if self.noise is not None else {}),
            }, keep_previous=True)
