"""What a repeated example is worth next to a fresh one, measured on the task while it trains.

hasten's own, for AutoEcho (``hasten.echo.auto``), which bounds e by it (``value_bound``:
a step whose repeats are mostly memorised stops paying); the schedule does not use it (a
step counts as a step, issue 44). A value fitted on one network and data set does not carry
to another: the toy calibration (``hasten.recipes.echo.value``) gives a first repeat
0.57, while on the CIFAR-10-JPEG target network a repeat is worth about 0.85
(docs/results/echo.md). This measures it from the gradients of the run itself.

To first order an SGD step on a gradient g lowers the population loss L by lr x g . grad L.
A fresh example's gradient is an unbiased estimate of grad L; a repeat's is not (the
network has already trained on it). What a repeat is worth next to a fresh example is
then E[g_repeat] . grad L / |grad L|^2. On a batch that holds both, split the first copies
into two disjoint random halves a and b; they are independent, so

    E[g_a . g_b] = |grad L|^2        E[g_r . (g_a + g_b) / 2] = E[g_r] . grad L

and the ratio of the sums of both over many batches estimates the value with neither sum
biased. Each product alone is noisy (a small batch's gradient is mostly noise), so
``RepeatValueEstimate`` (AutoEcho's) pools them robustly: ratios of sums over blocks of
reports, the median of the recent blocks, shrunk toward the prior by its standard error,
used only from a few blocks on, and measured less often once it stands. The measure is
first-order: it sees a memorised repeat's smaller, less aligned gradient, not what
repeats do to the gradient noise.

Changes the training math: no. The gradients are taken at the step's weights with
``torch.autograd.grad`` (``.grad`` is untouched) and the forwards run on copies of the
buffers (batch-norm running statistics are left as they were); it costs forwards and backwards
of three parts of the batch on each step that measures (``gradient_dots``: 3/8 of the batch
as the recipes call it, about 0.4 of a step in CPU seconds), on a few dozen steps of a run
(``RepeatValueEstimate``), preferably steps on which the loop waits for its input anyway.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

import torch


def gradient_dots(model: torch.nn.Module, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  inputs: torch.Tensor, targets: torch.Tensor, copies: torch.Tensor, *,
                  generator: torch.Generator | None = None, min_items: int = 4,
                  max_items: int | None = None) -> tuple[float, float] | None:
    """``(g_repeats . (g_a + g_b) / 2, g_a . g_b)`` on one batch, for
    ``AutoEcho.report_repeat_gradients``; None when the batch has fewer than ``min_items``
    repeats or ``2 x min_items`` first copies.

    a, b and the repeats r are three random parts of k items each: k = half the first copies,
    at most the repeats there are and ``max_items``. Equal parts take their gradients at one
    batch size (batch norm's statistics over as many items each), and a part of the repeats
    is as unbiased an estimate of E[g_r] as all of them; the cost is forwards and backwards
    of 3k items (3/8 of the batch with ``max_items`` = batch / 8, at any e).

    ``loss_of(outputs, targets)`` gives the mean loss of a part of the batch; ``copies``
    holds each item's copy number (0: first copy of its example, from the echo stage).
    Call it before the step's ``optimizer.step()`` (before or after its backward), on the
    step's inputs: the gradients are then at the step's weights."""
    copies = torch.as_tensor(copies).reshape(-1)
    if copies.numel() != len(inputs):
        raise ValueError(f"copies has {copies.numel()} entries for a batch of {len(inputs)}")
    first = torch.nonzero(copies == 0).flatten()
    repeats = torch.nonzero(copies > 0).flatten()
    if len(repeats) < min_items or len(first) < 2 * min_items:
        return None
    if max_items is not None and max_items < min_items:
        raise ValueError(f"max_items must be >= min_items ({min_items}); got {max_items}")
    first = first[torch.randperm(len(first), generator=generator)]
    k = min(len(first) // 2, len(repeats), max_items or len(repeats))
    a, b = first[:k], first[k:2 * k]
    repeats = repeats[torch.randperm(len(repeats), generator=generator)[:k]]
    named = dict(model.named_parameters())
    params = [v for v in named.values() if v.requires_grad]
    # Batch norm updates its running statistics on every forward in training mode, and the
    # step's own graph saved them (its backward checks they are unchanged): the extra
    # forwards run on copies of the buffers, so the model's are neither changed nor written.
    buffers = dict(model.named_buffers())

    def grad(part: torch.Tensor) -> list[torch.Tensor]:
        idx = part.to(inputs.device)
        state = {**named, **{k: v.clone() for k, v in buffers.items()}}
        out = torch.func.functional_call(model, state, (inputs[idx],))
        return list(torch.autograd.grad(loss_of(out, targets[idx.to(targets.device)]), params))

    ga, gb, gr = grad(a), grad(b), grad(repeats)
    fresh = sum((x.double() * y.double()).sum() for x, y in zip(ga, gb))
    repeat = sum((r.double() * (x.double() + y.double())).sum() for r, x, y in zip(gr, ga, gb)) / 2
    repeat, fresh = torch.stack([repeat, fresh]).tolist()  # one read from the device, not one per tensor
    return repeat, fresh


def observe_repeat_losses(auto, losses: torch.Tensor, copies: torch.Tensor) -> bool:
    """Report one step's per-item ``losses`` on first copies and on repeats to ``auto``
    (``AutoEcho.observe_loss``, which brings its cap on e down when repeats are being
    memorised); ``copies``: the items' copy numbers (0: a first copy). Nothing when the
    batch holds only one of the two kinds; returns whether it counted the step.

    The sums stay on the losses' device and are read every ``RepeatLossSums.EVERY`` counted
    steps, so that on CUDA the loop does not wait for the device every step."""
    return auto.repeat_losses.add(losses, copies)


class RepeatLossSums:
    """Per-item losses on first copies and on repeats, summed where they are (a CUDA
    tensor stays on the device), handed to ``report(fresh_mean, repeat_mean, steps)`` every
    ``EVERY`` steps that held both kinds: one read from the device per ``EVERY`` steps."""

    EVERY = 16  # steps per read: the cap on e moves once a window, and a window is a few steps

    def __init__(self, report: Callable[[float, float, int], object]):
        self.report = report  # (mean loss on first copies, on repeats, steps it covers)
        self._sums: torch.Tensor | None = None  # (loss on first copies, loss on repeats)
        self._counts = [0, 0]
        self._steps = 0

    def add(self, losses: torch.Tensor, copies: torch.Tensor) -> bool:
        repeat = torch.as_tensor(copies).reshape(-1) > 0
        n = int(repeat.sum())  # copies come from the host (the echo stage): no device read
        if n == 0 or n == len(repeat):
            return False
        per = losses.detach().reshape(-1)
        weights = repeat.to(device=per.device, dtype=per.dtype, non_blocking=True)
        total = per.sum()
        on_repeats = (per * weights).sum()
        sums = torch.stack([total - on_repeats, on_repeats])
        self._sums = sums if self._sums is None else self._sums + sums
        self._counts[0] += len(repeat) - n
        self._counts[1] += n
        self._steps += 1
        if self._steps >= self.EVERY:
            self.flush()
        return True

    def flush(self) -> None:
        """Report what is summed so far (one read from the device)."""
        if self._sums is None:
            return
        fresh, repeat = self._sums.tolist()
        self.report(fresh / self._counts[0], repeat / self._counts[1], self._steps)
        self._sums, self._counts, self._steps = None, [0, 0], 0


class RepeatValueEstimate:
    """What a repeat is worth next to a fresh example, from ``gradient_dots`` reports, with
    its uncertainty; and when to measure next.

    - Blocks: every ``BLOCK`` reports (summed over the ranks) make one block, whose value is
      the ratio of its sums (neither sum biased, see the module docstring). A block whose
      fresh sum is not positive holds noise only and is dropped. Blocks weigh alike, so the
      large gradients of early training do not outweigh the rest of the run (decayed sums
      did: a run at R = 4 read 0.08 from its first reports and kept below 0.5).
    - The measurement is the median of the last ``WINDOW`` blocks: one wild report spoils
      its block, not the estimate. Its standard error, 1.2533 x 1.4826 x MAD / sqrt(k) (the
      median's, from the blocks' median absolute deviation), at least ``SE_FLOOR``.
    - Shrinkage: a repeat's value is prior + w (measurement - prior), w = PRIOR_SD^2 /
      (PRIOR_SD^2 + se^2), the posterior mean of a normal prior around AutoEcho's
      ``repeat_value`` and a normal measurement. Before ``MIN_BLOCKS`` blocks w = 0: the
      value is the prior.
    - Cost: the loop measures every ``every`` steps until the value stands (``MIN_BLOCKS``
      blocks: the first dozen reports come within about a hundred steps of e leaving 1);
      from then on each measurement while the last block was steady (it left the
      measurement within ``TOLERANCE`` or two standard errors of where it was, and itself
      lay within three spreads of it: a small batch's dots are noisy, and a block moves the
      median by its noise) doubles the interval, up to ``MAX_SPREAD`` times ``every`` (geometric backoff:
      a 700-step run measures about 17 times, against 40 at a fixed 16); a block that is
      not steady brings it back to ``every`` (a change shows in one block, long before the
      median). A due measurement waits for a step on which the loop waits for its input
      anyway (``due(free=)``), for up to as many steps again: each costs about 0.4 of a
      step (3 x 32 of a batch of 256, measured in CPU seconds, issue 44), paid in time the
      loop would have waited.
    """

    BLOCK = 4
    WINDOW = 12
    MIN_BLOCKS = 3
    # Values measured so far run from 0.57 (the toy calibration) to 0.85-1.0 (the CIFAR-10-JPEG
    # target network): a prior that wide lets the task's own blocks decide within a few.
    PRIOR_SD = 0.25
    SE_FLOOR = 0.02
    TOLERANCE = 0.05
    MAX_SPREAD = 32  # 256 steps at the recipes' every = 8

    def __init__(self, every: int):
        self.every = every
        self.interval = every  # steps between measurements now
        self.blocks: deque[float] = deque(maxlen=self.WINDOW)
        self._open = [0.0, 0.0, 0]  # the block being filled: repeat sum, fresh sum, reports
        self._since = 0  # steps since the last measurement (value_due)
        self.taken = 0  # measurements asked for (due() true)
        self.steady = False  # whether the last block left the measurement where it was
        self.measurement: float | None = None  # the median of the recent blocks
        self.weight = 0.0  # w above: 0 before MIN_BLOCKS blocks

    def due(self, free: bool = True) -> bool:
        """One step passed; whether it should measure. ``free``: whether a measurement now
        costs the loop no time (it is waiting for its input: the measurement's forwards and
        backwards take time the next wait would have taken). A measurement that falls due on
        a step that is not free waits for one that is, for as many steps again as the
        interval at most: an input-bound loop measures at no cost, a compute-bound one half
        as often."""
        if not self.every:
            return False
        self._since += 1
        if self._since < self.interval or (not free and self._since < 2 * self.interval):
            return False
        self._since = 0
        self.taken += 1
        if self.steady:
            self.interval = min(self.interval * 2, self.MAX_SPREAD * self.every)
        return True

    def add(self, repeat_dot: float, fresh_dot: float, reports: int) -> bool:
        """Take the sums of ``reports`` reports; whether a block closed (the estimate moved)."""
        block = self._open
        block[0] += repeat_dot
        block[1] += fresh_dot
        block[2] += reports
        if block[2] < self.BLOCK:
            return False
        self._open = [0.0, 0.0, 0]
        if block[1] <= 0:
            return False
        value = block[0] / block[1]
        self.blocks.append(value)
        if len(self.blocks) < self.MIN_BLOCKS:
            return False
        values = sorted(self.blocks)
        k = len(values)
        median = _median(values)
        spread = 1.4826 * _median(sorted(abs(v - median) for v in values))  # a robust std of one block
        se = max(self.SE_FLOOR, 1.2533 * spread / math.sqrt(k))
        before = median if self.measurement is None else self.measurement  # (the first: against itself)
        self.steady = (abs(median - before) < max(self.TOLERANCE, 2 * se)
                       and abs(value - before) <= 3 * max(spread, self.TOLERANCE))
        if not self.steady:  # the value moved, or this block is far out: look again soon
            self.interval = self.every
        self.measurement = median
        self.weight = self.PRIOR_SD ** 2 / (self.PRIOR_SD ** 2 + se ** 2)
        return True

    def shrunk(self, prior: float) -> float:
        """A copy's value with this ``prior``: shrunk toward it, clipped to [0.05, 1]."""
        if self.measurement is None:
            return prior
        return min(1.0, max(0.05, prior + self.weight * (self.measurement - prior)))


def _median(values: list[float]) -> float:
    k = len(values)
    return values[k // 2] if k % 2 else (values[k // 2 - 1] + values[k // 2]) / 2
