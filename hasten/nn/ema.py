"""Weight averaging: exponential moving average (EMA) and Lookahead.

EMA of weights for evaluation is from David Page, "How to train your ResNet,
part 7" (EMA every 5 steps, evaluated on the averaged weights: 36 s -> 34 s).
Lookahead (Zhang, Lucas, Hinton, Ba, 2019) as used by Keller Jordan's airbench:
the same EMA, but the averaged weights are copied back into the live model, with a
decay that rises during training (``airbench_decay_schedule``).

Changes the training math: EMA no (it only changes which weights are evaluated);
Lookahead yes (the training trajectory is pulled back to the average).
"""

from __future__ import annotations

import torch
from torch import nn


class WeightAverage:
    """Keeps ``avg = decay * avg + (1 - decay) * weights`` of a model's floating-point
    state (parameters and float buffers, e.g. batch-norm running statistics)."""

    def __init__(self, model: nn.Module) -> None:
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module, decay: float) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"Invalid decay value: {decay} (expected 0 <= decay <= 1)")
        current = model.state_dict()
        for k, avg in self.state.items():
            avg.lerp_(current[k].detach().to(avg.dtype), 1.0 - decay)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged weights into ``model``."""
        current = model.state_dict()
        for k, avg in self.state.items():
            current[k].copy_(avg)


class Lookahead(WeightAverage):
    """EMA whose average is copied back into the model after every update."""

    @torch.no_grad()
    def update(self, model: nn.Module, decay: float) -> None:
        super().update(model, decay)
        self.copy_to(model)


def warmup_decay(decay: float, num_updates: int) -> float:
    """``min(decay, (1 + n) / (10 + n))`` after n updates (TensorFlow's
    ExponentialMovingAverage ``num_updates``): early averages follow the weights
    closely instead of staying anchored to the random initialisation."""
    return min(decay, (1 + num_updates) / (10 + num_updates))


def airbench_decay_schedule(total_steps: int) -> torch.Tensor:
    """airbench's Lookahead decay per step: 0.95**5 * (step / total)**3, so the
    average is loose early (weights move freely) and tight at the end."""
    return 0.95 ** 5 * (torch.arange(total_steps + 1) / total_steps) ** 3
