"""Learning-rate rules for large batches, as ``torch.optim.lr_scheduler`` objects.

Based on: P. Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in
1 Hour" (arXiv:1706.02677): the linear scaling rule ``lr = base * batch / 256``
and gradual linear warm-up; Y. You et al., "Large Batch Training of Convolutional
Networks" (arXiv:1708.03888) and Ying et al. (arXiv:1811.06992): polynomial
(power 2) decay after warm-up; L. Smith, "Super-Convergence" (arXiv:1708.07120):
the one-cycle (piecewise-linear) schedule.

Changes the training math: yes (they set the learning rate at every step).

All schedulers are meant to be stepped once per optimizer step (not per epoch),
and return to the exact same value after ``load_state_dict``.
"""

from __future__ import annotations

import bisect

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["scaled_lr", "WarmupPolyDecay", "PiecewiseLinear", "one_cycle"]


def scaled_lr(base_lr: float, batch_size: int, base_batch: int = 256) -> float:
    """Goyal et al.'s linear scaling rule: ``base_lr * batch_size / base_batch``."""
    if not base_lr > 0:
        raise ValueError(f"Invalid base_lr: {base_lr} (must be > 0)")
    if batch_size < 1 or base_batch < 1:
        raise ValueError(
            f"Invalid batch sizes: batch_size={batch_size}, base_batch={base_batch} (must be >= 1)"
        )
    return base_lr * batch_size / base_batch


class _FactorScheduler(LRScheduler):
    """lr = base_lr * factor(step); subclasses define ``factor``."""

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def get_lr(self):
        f = self.factor(self.last_epoch)
        return [base * f for base in self.base_lrs]


class WarmupPolyDecay(_FactorScheduler):
    """Linear warm-up from ``warmup_start`` x lr to lr over ``warmup_steps``, then
    ``lr * (1 - t) ** power`` with t going from 0 to 1 at ``total_steps``
    (``power=2`` as in You et al.; ``power=0`` is warm-up then constant;
    ``power=1`` linear decay). Steps past ``total_steps`` stay at the end value.

    Factor at step s: ``warmup_start + (1 - warmup_start) * s / warmup_steps`` for
    s < warmup_steps, then ``(1 - (s - W) / (T - W)) ** power``.
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 power: float = 2.0, warmup_start: float = 0.0, last_epoch: int = -1):
        if total_steps < 1:
            raise ValueError(f"Invalid total_steps: {total_steps} (must be >= 1)")
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(
                f"Invalid warmup_steps: {warmup_steps} (must be in [0, total_steps={total_steps}))"
            )
        if power < 0:
            raise ValueError(f"Invalid power: {power} (must be >= 0)")
        if not 0.0 <= warmup_start <= 1.0:
            raise ValueError(f"Invalid warmup_start: {warmup_start} (must be in [0, 1])")
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.power = power
        self.warmup_start = warmup_start
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.warmup_start + (1.0 - self.warmup_start) * step / self.warmup_steps
        t = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return (1.0 - t) ** self.power


class PiecewiseLinear(_FactorScheduler):
    """Factor interpolated linearly between ``(step, factor)`` knots; constant
    before the first and after the last knot. ``milestones`` must increase."""

    def __init__(self, optimizer: Optimizer, milestones: list[int], factors: list[float],
                 last_epoch: int = -1):
        if len(milestones) != len(factors) or not milestones:
            raise ValueError(
                f"milestones and factors must be non-empty and equally long, got "
                f"{len(milestones)} and {len(factors)}"
            )
        if any(b <= a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"Invalid milestones: {milestones} (must strictly increase)")
        if any(f < 0 for f in factors):
            raise ValueError(f"Invalid factors: {factors} (must be >= 0)")
        self.milestones = list(milestones)
        self.factors = list(factors)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        m, f = self.milestones, self.factors
        if step <= m[0]:
            return f[0]
        if step >= m[-1]:
            return f[-1]
        i = bisect.bisect_right(m, step)
        t = (step - m[i - 1]) / (m[i] - m[i - 1])
        return f[i - 1] + t * (f[i] - f[i - 1])


def one_cycle(optimizer: Optimizer, total_steps: int, peak_fraction: float = 0.25,
              start: float = 0.0, end: float = 0.0) -> PiecewiseLinear:
    """One cycle: linear from ``start`` to 1 at ``peak_fraction * total_steps``,
    then linear to ``end`` at ``total_steps``."""
    if not 0.0 < peak_fraction < 1.0:
        raise ValueError(f"Invalid peak_fraction: {peak_fraction} (must be in (0, 1))")
    if total_steps < 2:
        raise ValueError(f"Invalid total_steps: {total_steps} (must be >= 2)")
    peak = max(1, min(total_steps - 1, round(peak_fraction * total_steps)))
    return PiecewiseLinear(optimizer, [0, peak, total_steps], [start, 1.0, end])
