"""The training loop every hasten recipe runs, read top to bottom.

For each batch: forward (under bf16 autocast when asked), loss, backward, the
optimizer's step, the schedule's step. A recipe adds what is its own through
four hooks, each called with the :class:`Step` so far:

- ``before_forward``: at the step's weights, before anything of the step ran
  (the echo run's repeat-value probe; the echo sweep's learning rate);
- ``before_backward``: the loss is known, no gradient yet (the noise-scale probe of
  ``hasten train``);
- ``before_update``: gradients present, weights not yet changed (the echo sweep's
  repeat-value probe, ``hasten.echo.repeat_value.gradient_dots``);
- ``after_step``: the step is done (meters, progress, evaluation, checkpoints,
  weight averages); a true return value ends the loop (a target reached, a budget
  spent).

The loop owns nothing else: the batches (epochs, resume positions, the time spent
waiting for input) are the recipe's iterable, and so is everything after the
last step. Airbench's training loop (Keller Jordan, 2024) is the model: a page a
person reads once and then recognises in every recipe.

Changes the training math: no (each recipe's math is its model, loss, optimizer,
schedule and batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from hasten.nn.precision import autocast
from hasten.recipes.step import optimizer_step

__all__ = ["Step", "train_loop"]

Hook = Callable[["Step"], Any]


@dataclass
class Step:
    """One step as the hooks see it. ``number``: steps done before this one until the
    optimizer has stepped, this one included from ``after_step`` on. ``extra``: the
    batch's entries after its inputs and labels (echo copies, keys, measured waits)."""
    number: int
    x: Tensor
    y: Tensor
    extra: tuple
    logits: Tensor | None = None
    loss: Tensor | None = None  # as the loss function returned it: per example, mean or sum


def train_loop(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[tuple],
               loss_fn: Callable[[Tensor, Tensor], Tensor], *,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
               device: torch.device | str = "cpu", bf16: bool = False, step: int = 0, stop_after: int | None = None,
               before_forward: Hook | None = None, before_backward: Hook | None = None,
               before_update: Hook | None = None, after_step: Hook | None = None) -> int:
    """Train ``model`` on ``batches`` of ``(inputs, labels, *extra)``; returns the step
    count reached, counting from ``step``.

    ``loss_fn(logits, labels)`` gives the loss to minimise, or one loss per example, whose
    mean is minimised. The loop ends when ``batches`` does, when the count reaches
    ``stop_after``, or when ``after_step`` returns true; the batches' iterator is closed
    then (a generator's ``finally`` runs at once, not when it is collected)."""
    it = iter(batches)
    try:
        for x, y, *extra in it:
            s = Step(step, x, y, tuple(extra))
            if before_forward is not None:
                before_forward(s)
            with autocast(device, bf16):
                s.logits = model(x)
            s.loss = loss_fn(s.logits, y)
            if before_backward is not None:
                before_backward(s)
            objective = s.loss if s.loss.dim() == 0 else s.loss.mean()
            optimizer_step(objective, optimizer, scheduler,
                           before_update=(lambda: before_update(s)) if before_update is not None else None)
            step += 1
            s.number = step
            stop = after_step(s) if after_step is not None else False
            if stop or (stop_after is not None and step >= stop_after):
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    return step
