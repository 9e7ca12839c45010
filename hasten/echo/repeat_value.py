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
``torch.autograd.grad`` (``.grad`` is untouched) and the buffers (batch-norm running
statistics) are restored; it costs about one more forward and backward of the batch
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
    Call it before the step's ``optimizer.step()``, on the step's inputs."""
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
    params = [p for p in model.parameters() if p.requires_grad]
    # Batch norm updates its running statistics on every forward in training mode: the
    # three extra forwards must leave them as they were.
    saved = [buf.detach().clone() for buf in model.buffers()]
    try:
        def grad(part: torch.Tensor) -> list[torch.Tensor]:
            idx = part.to(inputs.device)
            return list(torch.autograd.grad(loss_of(model(inputs[idx]), targets[idx.to(targets.device)]), params))

        ga, gb, gr = grad(a), grad(b), grad(repeats)
    finally:
        with torch.no_grad():
            for buf, old in zip(model.buffers(), saved):
                buf.copy_(old)
    fresh = sum(float((x.double() * y.double()).sum()) for x, y in zip(ga, gb))
    repeat = sum(float((r.double() * (x.double() + y.double())).sum()) / 2 for r, x, y in zip(gr, ga, gb))
    return repeat, fresh
