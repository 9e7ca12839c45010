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

import weakref

import torch
from torch import nn


def _float_state_slots(model: nn.Module, keys) -> list[tuple[dict, str]] | None:
    """For each state-dict key, the dict that holds it (its module's ``_parameters``
    or ``_buffers``) and its name there. Reading ``d[name]`` gives the live tensor
    even after ``model.to(...)`` swaps tensors, without walking ``state_dict()``.
    None when a key is not a plain parameter or buffer path (custom state dicts)."""
    slots = []
    for key in keys:
        owner_name, _, name = key.rpartition(".")
        try:
            owner = model.get_submodule(owner_name)
        except AttributeError:
            return None
        holder = owner._parameters if name in owner._parameters else owner._buffers
        if holder.get(name) is None:
            return None
        slots.append((holder, name))
    return slots


class WeightAverage:
    """Keeps ``avg = decay * avg + (1 - decay) * weights`` of a model's floating-point
    state (parameters and float buffers, e.g. batch-norm running statistics).

    An update is one ``torch._foreach_lerp_`` over cached tensor lists (a few
    kernel launches for the whole model), not a ``state_dict()`` walk and one
    kernel per tensor; the arithmetic is the same ``lerp``."""

    def __init__(self, model: nn.Module) -> None:
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
        self._averages = list(self.state.values())
        self._model: weakref.ref | None = None
        self._slots: list[tuple[dict, str]] | None = None

    def _live(self, model: nn.Module) -> list[torch.Tensor]:
        """``model``'s tensors in the order of ``self.state`` (used under no_grad only)."""
        if self._model is None or self._model() is not model:
            self._slots = _float_state_slots(model, self.state)
            self._model = weakref.ref(model)
        if self._slots is None:
            current = model.state_dict()
            return [current[k] for k in self.state]
        return [d[name] for d, name in self._slots]

    @torch.no_grad()
    def update(self, model: nn.Module, decay: float) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"Invalid decay value: {decay} (expected 0 <= decay <= 1)")
        # The average keeps its own precision when the model's dtype differs.
        live = [t if t.dtype == a.dtype else t.to(a.dtype) for t, a in zip(self._live(model), self._averages)]
        torch._foreach_lerp_(self._averages, live, 1.0 - decay)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged weights into ``model``."""
        torch._foreach_copy_(self._live(model), self._averages)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged tensors by state-dict key (for a checkpoint)."""
        return dict(self.state)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a :meth:`state_dict` back in place (the cached tensor lists stay valid)."""
        if set(state) != set(self.state):
            raise ValueError(f"the averaged state's keys differ from this model's: "
                             f"{sorted(set(state) ^ set(self.state))[:5]}")
        torch._foreach_copy_(self._averages, [state[k] for k in self.state])


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
