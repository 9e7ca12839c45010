"""One training step as every hasten training loop takes it: ``optimizer_step``
(backward, optimizer, scheduler) and ``TrainMeter`` (the training loss and accuracy
summed on the device, read only when reported).

Used by ``hasten.recipes.loop`` (the loop every recipe runs) and the recipes' meters;
each works in a plain PyTorch loop too. Changes the
training math: no.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["TrainMeter", "optimizer_step"]


def optimizer_step(loss: Tensor, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, *,
                   before_update: Callable[[], object] | None = None) -> None:
    """Backpropagate ``loss``, call ``before_update`` (gradients present, weights not
    yet changed), step ``optimizer`` and then ``scheduler``. Gradients are set to None
    rather than zeroed: no memset, and the first backward writes."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if before_update is not None:
        before_update()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()


class TrainMeter:
    """Training loss and accuracy since the last :meth:`reset`, summed on the device.

    Reading ``.item()`` after every step would make the host wait for the device
    every step; here only reading :attr:`loss` or :attr:`accuracy` synchronises.
    """

    def __init__(self, device: torch.device | str) -> None:
        self._loss = torch.zeros((), device=device)
        self._correct = torch.zeros((), device=device, dtype=torch.long)
        self.seen = 0

    @torch.no_grad()
    def update(self, loss_sum: Tensor, logits: Tensor, labels: Tensor) -> None:
        """Add one batch: ``loss_sum`` is its loss summed (not averaged) over examples."""
        self._loss += loss_sum.detach().float()
        self._correct += (logits.argmax(1) == labels).sum()
        self.seen += len(labels)

    @property
    def loss(self) -> float:
        """Mean loss per example (a device sync)."""
        return self._loss.item() / max(self.seen, 1)

    @property
    def accuracy(self) -> float:
        """Fraction of examples whose top logit was the label (a device sync)."""
        return self._correct.item() / max(self.seen, 1)

    def reset(self) -> None:
        self._loss.zero_()
        self._correct.zero_()
        self.seen = 0
