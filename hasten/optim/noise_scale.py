"""The gradient noise scale: how large a batch still pays, measured while training.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training"
(arXiv:1812.06162). With G the true gradient and Sigma the per-example gradient
covariance, the simple noise scale

    B_simple = tr(Sigma) / |G|^2

predicts the critical batch: below it, doubling the batch about halves the steps
to a target (perfect scaling); above it, steps stop falling and each doubling
costs more compute for little gain.

Estimate (their appendix A). The squared norm of a gradient averaged over B
examples has expectation ``E|G_B|^2 = |G|^2 + tr(Sigma) / B``. From two batch
sizes B_small < B_big, both unbiased:

    |G|^2      ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma)  ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

Each is noisy (the |G|^2 one can go negative), so each is smoothed with its own
exponential moving average and the ratio is taken of the averages, not averaged.

Where the two batch sizes come from, at no extra backward pass:

- under DDP, B_small is one rank's batch and B_big the global batch: the local
  gradient is each bucket before the all-reduce and the global one after it
  (:func:`register_noise_scale_hook`, a comm hook wrapping any other); |G_small|^2
  is averaged over ranks (one scalar all-reduce per measured step);
- on one process, micro-batches whose gradients are summed (gradient accumulation,
  or :func:`micro_batch_sq_norms` for a probe): their mean squared norm is the
  small one, the squared norm of their mean the big one.

Usage in any loop::

    est = NoiseScale()
    est.update(small_sq, big_sq, b_small, b_big)     # once per measured step
    est.b_simple                                     # the smoothed estimate

Changes the training math: no (it reads gradients; the probe leaves parameters,
gradients, optimizer state and batch-norm running statistics untouched).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

__all__ = ["NoiseScale", "micro_batch_sq_norms", "register_noise_scale_hook", "suggest_batch", "sq_norm"]


def sq_norm(tensors: Iterable[Tensor | None]) -> Tensor:
    """Sum of squares of every element of ``tensors`` (None entries skipped), in float32
    or wider, as a 0-dim tensor on their device (no host sync)."""
    parts = [t.detach().float().pow(2).sum() for t in tensors if t is not None]
    if not parts:
        return torch.zeros(())
    return torch.stack(parts).sum()


class NoiseScale:
    """Smoothed estimate of the simple gradient noise scale B_simple = tr(Sigma) / |G|^2.

    Args:
        beta: EMA factor for the |G|^2 and tr(Sigma) estimates (McCandlish et al.
            smooth both; 0.99 over steps in their experiments; 0.95 suits a
            measurement every few steps). The averages are bias-corrected, as Adam's.

    Call :meth:`update` with the squared gradient norms at two batch sizes; read
    :attr:`b_simple`, :attr:`g2`, :attr:`trace`. ``history`` keeps every
    (step, b_simple) pair :meth:`update` was given a step for.
    """

    def __init__(self, beta: float = 0.95) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self._g2 = 0.0
        self._trace = 0.0
        self._weight = 0.0  # 1 - beta^n: the bias correction
        self.updates = 0
        self.history: list[tuple[int, float]] = []
        self._sums = [0.0, 0.0, 0]  # unbiased |G|^2 and tr(Sigma) summed since reset_window()

    @staticmethod
    def unbiased(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
        """The single-measurement unbiased estimates (|G|^2, tr(Sigma)) from the squared
        norms of gradients averaged over ``b_small`` and ``b_big`` examples."""
        if not 0 < b_small < b_big:
            raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
        g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        return g2, trace

    def update(self, small_sq: float | Tensor, big_sq: float | Tensor, b_small: float, b_big: float,
               step: int | None = None) -> float:
        """Add one measurement; returns the new :attr:`b_simple`. ``small_sq``: squared
        norm of a gradient over ``b_small`` examples (or the mean of several such);
        ``big_sq``: of the gradient over ``b_big`` examples."""
        g2, trace = self.unbiased(float(small_sq), float(big_sq), b_small, b_big)
        if not (math.isfinite(g2) and math.isfinite(trace)):
            return self.b_simple
        b = self.beta
        self._g2 = b * self._g2 + (1 - b) * g2
        self._trace = b * self._trace + (1 - b) * trace
        self._weight = b * self._weight + (1 - b)
        self.updates += 1
        self._sums[0] += g2
        self._sums[1] += trace
        self._sums[2] += 1
        value = self.b_simple
        if step is not None:
            self.history.append((int(step), value))
        return value

    @property
    def g2(self) -> float:
        """Smoothed |G|^2 (nan before the first update)."""
        return self._g2 / self._weight if self._weight else math.nan

    @property
    def trace(self) -> float:
        """Smoothed tr(Sigma) (nan before the first update)."""
        return self._trace / self._weight if self._weight else math.nan

    @property
    def b_simple(self) -> float:
        """tr(Sigma) / |G|^2 of the smoothed estimates; nan before the first update or
        while the smoothed |G|^2 is not positive (the gradient is all noise so far)."""
        if not self._weight or self._g2 <= 0:
            return math.nan
        return self._trace / self._g2

    def reset_window(self) -> None:
        """Start a new window for :attr:`b_simple_window` (e.g. at half of training)."""
        self._sums = [0.0, 0.0, 0]

    @property
    def b_simple_window(self) -> float:
        """tr(Sigma) / |G|^2 of the plain means of every measurement since :meth:`reset_window`
        (or the start): steadier than the moving average when |G|^2 is small against the
        noise, as late in training; nan without measurements or while the mean |G|^2 <= 0."""
        g2, trace, n = self._sums
        if not n or g2 <= 0:
            return math.nan
        return trace / g2

    @property
    def window_updates(self) -> int:
        return self._sums[2]

    def state_dict(self) -> dict:
        return {"beta": self.beta, "g2": self._g2, "trace": self._trace, "weight": self._weight,
                "updates": self.updates, "history": list(self.history), "window": list(self._sums)}

    def load_state_dict(self, state: dict) -> None:
        self.beta = state["beta"]
        self._g2, self._trace, self._weight = state["g2"], state["trace"], state["weight"]
        self.updates = state["updates"]
        self.history = [tuple(h) for h in state.get("history", [])]
        self._sums = list(state.get("window", [0.0, 0.0, 0]))


def micro_batch_sq_norms(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor],
                         micro_batches: Sequence[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """(mean over micro-batches of |g_i|^2, |mean of g_i|^2) for the gradients g_i of
    ``loss_fn(model(x), y)`` (a mean over the micro-batch) on each ``(x, y)`` of
    ``micro_batches`` (equal sizes). A probe: computed with ``torch.autograd.grad``, so
    ``.grad`` and the optimizer are untouched, and with batch-norm running statistics
    frozen (momentum 0 during the probe). Feed the result to
    ``NoiseScale.update(small, big, b, k * b)``."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m, m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None)
             for m in norms]
    for m in norms:
        m.momentum = 0.0
    total = None
    small = torch.zeros(())
    try:
        for x, y in micro_batches:
            grads = torch.autograd.grad(loss_fn(model(x), y), params)
            small = small + sq_norm(grads).cpu()
            total = [g.detach().float() for g in grads] if total is None else [t.add_(g) for t, g in zip(total, grads)]
    finally:
        for m, momentum, tracked in saved:
            m.momentum = momentum
            if tracked is not None:
                m.num_batches_tracked.copy_(tracked)
    k = len(micro_batches)
    big = sq_norm(t / k for t in total)
    return float(small) / k, float(big)


class _HookState:
    """What :func:`noise_scale_hook` carries: the wrapped hook and this step's sums."""

    def __init__(self, inner_hook, inner_state, process_group=None) -> None:
        self.inner_hook = inner_hook
        self.inner_state = inner_state
        self.process_group = process_group
        self.enabled = True
        self.local: list[Tensor] = []    # per bucket, before the all-reduce
        self.reduced: list[Tensor] = []  # per bucket, after it


def noise_scale_hook(state: _HookState, bucket):
    """DDP comm hook: the squared norm of the local bucket, then the wrapped hook, then
    the squared norm of its (averaged) result. ``list.append`` is atomic, so hooks whose
    futures complete on another thread (hasten's gloo hooks) may record concurrently."""
    buf = bucket.buffer()
    if state.enabled:
        state.local.append(buf.detach().float().pow(2).sum())
    if state.inner_hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        fut = allreduce_hook(state.process_group, bucket)
    else:
        fut = state.inner_hook(state.inner_state, bucket)
    if not state.enabled:
        return fut

    def after(f):
        value = f.value()
        out = value[0] if isinstance(value, (list, tuple)) else value
        state.reduced.append(out.detach().float().pow(2).sum())
        return out

    return fut.then(after)


class NoiseScaleHook:
    """The DDP side of the estimate: registered with :func:`register_noise_scale_hook`;
    after each backward, :meth:`update` turns the recorded sums into one measurement.
    Set ``enabled = False`` to skip recording on a step (the all-reduce still runs)."""

    def __init__(self, state: _HookState, estimator: NoiseScale, local_batch: int, world_size: int) -> None:
        self.state = state
        self.estimator = estimator
        self.local_batch = local_batch
        self.world_size = world_size

    @property
    def enabled(self) -> bool:
        return self.state.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.state.enabled = bool(value)

    def update(self, step: int | None = None) -> float:
        """Average the local |g|^2 over ranks (one scalar all-reduce) and add the
        measurement to the estimator; returns B_simple. Call on every rank after
        backward (the all-reduce is collective). Clears the step's sums."""
        import torch.distributed as dist

        s = self.state
        if not s.local:
            return self.estimator.b_simple
        local = torch.stack(s.local).sum()
        reduced = torch.stack(s.reduced).sum()
        s.local.clear()
        s.reduced.clear()
        small = (local / self.world_size).reshape(1)
        dist.all_reduce(small, group=s.process_group)  # the mean of the ranks' local |g|^2
        return self.estimator.update(float(small), float(reduced), self.local_batch,
                                     self.local_batch * self.world_size, step)


def register_noise_scale_hook(ddp_model, estimator: NoiseScale, local_batch: int, *, inner_hook=None,
                              inner_state=None, process_group=None) -> NoiseScaleHook:
    """Register on ``ddp_model`` a comm hook that measures the local and the averaged
    gradient norms around ``inner_hook(inner_state, bucket)`` (default: DDP's own
    all-reduce average). Register it instead of the inner hook (DDP takes one)."""
    import torch.distributed as dist

    state = _HookState(inner_hook, inner_state, process_group)
    ddp_model.register_comm_hook(state, noise_scale_hook)
    world = dist.get_world_size(process_group)
    return NoiseScaleHook(state, estimator, local_batch, world)


def suggest_batch(b_simple: float, batch: int) -> tuple[int, str]:
    """A global batch to train at, and why, from a measured B_simple: the power of two
    nearest to it (McCandlish et al.: the critical batch, where steps stop halving
    with each doubling; their Figure 4 finds B_crit ~ B_simple within a small factor)."""
    if not math.isfinite(b_simple) or b_simple <= 0:
        return batch, ("no usable estimate (|G|^2 not yet positive after smoothing); "
                       f"keep global batch {batch}")
    suggested = 2 ** max(0, round(math.log2(b_simple)))
    if batch < b_simple / 2:
        why = (f"the batch {batch} is well below the noise scale: up to about {suggested} images, each doubling "
               "of the batch should still about halve the steps (perfect scaling), so a larger batch on more "
               "devices pays")
    elif batch > 2 * b_simple:
        why = (f"the batch {batch} is well above the noise scale: past about {suggested} images, doubling the "
               "batch no longer halves the steps; the extra devices buy little")
    else:
        why = (f"the batch {batch} is near the noise scale: about where larger batches stop paying "
               "(steps to a target stop halving)")
    return suggested, why
