"""What a repeated example is worth next to a fresh one, measured on the task while it trains.

hasten's own, for AutoEcho (``hasten.echo.auto``), whose schedule counts a repeat as a
share of a fresh example. A share fitted on one network and data set does not carry
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
biased. Each product alone is noisy (a small batch's gradient is mostly noise), which
is why ``AutoEcho.report_repeat_gradients`` sums many before it uses them. The measure
is first-order: it sees a memorised repeat's smaller, less aligned gradient, not what
repeats do to the gradient noise.

Changes the training math: no. The gradients are taken at the step's weights with
``torch.autograd.grad`` (``.grad`` is untouched) and the forwards run on copies of the
buffers (batch-norm running statistics are left as they were); it costs about one more forward and backward of the batch
on each step that measures.
"""

from __future__ import annotations

from typing import Callable

import torch


def gradient_dots(model: torch.nn.Module, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  inputs: torch.Tensor, targets: torch.Tensor, copies: torch.Tensor, *,
                  generator: torch.Generator | None = None, min_items: int = 4) -> tuple[float, float] | None:
    """``(g_repeats . (g_a + g_b) / 2, g_a . g_b)`` on one batch, for
    ``AutoEcho.report_repeat_gradients``; None when the batch has fewer than ``min_items``
    repeats or ``2 x min_items`` first copies.

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
    first = first[torch.randperm(len(first), generator=generator)]
    half = len(first) // 2
    a, b = first[:half], first[half:2 * half]
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
    fresh = sum(float((x.double() * y.double()).sum()) for x, y in zip(ga, gb))
    repeat = sum(float((r.double() * (x.double() + y.double())).sum()) / 2 for r, x, y in zip(gr, ga, gb))
    return repeat, fresh


def observe_repeat_losses(auto, losses: torch.Tensor, copies: torch.Tensor) -> bool:
    """Report one step's mean loss on first copies and on repeats to ``auto``
    (``AutoEcho.observe_loss``, which brings its cap on e down when repeats are being
    memorised); ``losses``: the step's per-item losses, ``copies``: the items' copy
    numbers (0: a first copy). Nothing when the batch holds only one of the two kinds;
    returns whether it reported. (Reads two numbers from the device.)"""
    repeat = torch.as_tensor(copies).reshape(-1).to(losses.device) > 0
    n = int(repeat.sum())
    if n == 0 or n == len(repeat):
        return False
    per = losses.detach()
    auto.observe_loss(float(per[~repeat].mean()), float(per[repeat].mean()))
    return True
