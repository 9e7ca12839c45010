"""Optimizers and learning-rate schedules for large-batch training."""

from hasten.optim.lars import Lars, lars, lars_param_groups
from hasten.optim.schedules import PiecewiseLinear, WarmupPolyDecay, one_cycle, scaled_lr

__all__ = [
    "Lars",
    "lars",
    "lars_param_groups",
    "scaled_lr",
    "WarmupPolyDecay",
    "PiecewiseLinear",
    "one_cycle",
]
