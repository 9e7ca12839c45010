"""What both echo runs add to the training loop they share (``hasten.recipes.loop.train_loop``):
``train_to_target`` (``hasten.recipes.echo.run``) and the sweep's ``train_budget``
(``hasten.recipes.echo.budget``).

- ``InputClock``: the run's clock as two stopwatches, waiting for input and stepping; the
  wall time is their sum, and the upstream's ratio R is (wait + step) / step.
- ``RepeatValue``: what a repeated example is worth on this task, measured for AutoEcho
  (``hasten.echo.repeat_value``): the gradient dots of a batch's repeats and first copies
  at the step's weights when AutoEcho asks, and each step's losses of both.
- ``paused``: an evaluation stops the slow storage and AutoEcho's measurement, so it gives
  no run free upstream time.

Changes the training math: no (the probe's gradients are its own; the step's are untouched).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from typing import Callable

import torch

from hasten.echo import AutoEcho
from hasten.echo.repeat_value import gradient_dots, observe_repeat_losses
from hasten.nn.precision import autocast
from hasten.timing import Stopwatch

__all__ = ["InputClock", "RepeatValue", "paused"]


class InputClock:
    """Seconds spent waiting for the next batch (``waiting``) and stepping (``stepping``:
    preparing the batch and the training step), on ``device``'s clock."""

    def __init__(self, device=None) -> None:
        self.waiting, self.stepping = Stopwatch(device), Stopwatch(device)

    @property
    def wall_s(self) -> float:
        return self.waiting.elapsed + self.stepping.elapsed


class RepeatValue:
    """The repeat-value measurements of a run with AutoEcho ``auto``; none without it, or
    with batch echoing (``variant == "batch"``), which puts no repeat beside its first copy.

    :meth:`probe` (at the step's weights, before its update): every ``auto.value_due()``
    step, ``gradient_dots`` of ``loss_of`` (the mean loss; parts of at most an eighth of the
    batch) under bf16 autocast when
    ``bf16``, reported to ``auto``; the examples it compares are drawn from a generator
    seeded with ``seed``. Given the seconds the step waited for its batch, a due measurement
    is taken on a step that waited at least as long as the last measurement took (it then
    takes time the loop would have waited; ``AutoEcho.value_due``). :meth:`observe` (after
    the step): the step's per-item losses on first copies and repeats (repeats memorised:
    the cap on e comes down)."""

    def __init__(self, auto: AutoEcho | None, variant: str, model: torch.nn.Module,
                 loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], seed: int, *,
                 device=None, bf16: bool = False) -> None:
        self.auto, self.model, self.loss_of, self.device, self.bf16 = auto, model, loss_of, device, bf16
        self.on = auto is not None and variant != "batch"
        self.generator = torch.Generator().manual_seed(seed)
        self.cost_s = 0.0  # the last measurement's seconds (its end waits for the device: .tolist())

    def probe(self, x: torch.Tensor, y: torch.Tensor, copies: torch.Tensor, waited_s: float | None = None) -> None:
        """``waited_s``: the seconds the step waited for its batch (None: measure whenever due)."""
        if self.on and self.auto.value_due(free=waited_s is None or waited_s >= self.cost_s):
            start = time.perf_counter()
            with autocast(self.device, self.bf16):
                # Parts of an eighth of the batch (16 items at least: smaller ones are mostly noise):
                # 3/8 of a step's forward and backward at the recipes' batch of 256.
                dots = gradient_dots(self.model, self.loss_of, x, y, copies, generator=self.generator,
                                     max_items=max(16, len(x) // 8))
            self.cost_s = time.perf_counter() - start
            if dots is not None:
                self.auto.report_repeat_gradients(*dots)

    def observe(self, losses: torch.Tensor, copies: torch.Tensor) -> None:
        if self.on:
            observe_repeat_losses(self.auto, losses, copies)


@contextmanager
def paused(*clocks):
    """Inside the block, each of ``clocks`` (objects with a ``paused()`` context; None:
    skipped) stands still: an evaluation's time is nobody's upstream time."""
    with ExitStack() as stack:
        for clock in clocks:
            if clock is not None:
                stack.enter_context(clock.paused())
        yield
