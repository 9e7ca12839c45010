"""What every hasten training loop shares: the data it trains on, one optimisation
step, and the training loss and accuracy summed on the device.

Used by ``hasten.recipes.speedrun`` and ``hasten.recipes.train``; each piece works
in a plain PyTorch loop too. Changes the training math: no.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from hasten.data import ImageDataset, load_dataset
from hasten.errors import ConfigError

__all__ = ["TrainMeter", "load_training_data", "optimizer_step"]


def load_training_data(path: str | os.PathLike | None, *, batch_size: int, train_subset: int = 0,
                       image_size: int | None = None, dataset: ImageDataset | None = None) -> ImageDataset:
    """The data set a recipe trains on: ``dataset`` when given, else
    ``load_dataset(path, image_size=...)``; then the seeded random subset of
    ``train_subset`` training images (0: all of them). Raises ``ConfigError`` when
    the subset is larger than the set or the training set cannot fill one batch."""
    data = dataset if dataset is not None else load_dataset(path, image_size=image_size)
    if train_subset:
        if not 0 < train_subset <= len(data.train):
            raise ConfigError(f"--train-subset must be in 1..{len(data.train)}, got {train_subset}")
        data = data.with_train_subset(train_subset, seed=0)
    if len(data.train) < batch_size:
        raise ConfigError(f"the training set has {len(data.train)} images, fewer than one global batch of "
                          f"{batch_size}: pass a smaller --batch-size")
    return data


def optimizer_step(loss: Tensor, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
    """Backpropagate ``loss``, step ``optimizer`` and then ``scheduler``. Gradients
    are set to None rather than zeroed: no memset, and the first backward writes."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
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
