"""Test-time augmentation (TTA): average the logits of augmented copies.

Horizontal-flip TTA is from David Page, "How to train your ResNet, part 8" (the
last step to 26 s); flip + one-pixel translations (multi-crop) from Keller
Jordan's airbench.

Changes the training math: no. Only evaluation is affected: predictions average
``levels`` views of each test image.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from hasten.nn.precision import autocast

TTA_LEVELS = ("none", "flip", "flip_translate")


def tta_logits(model: nn.Module, x: torch.Tensor, level: str = "flip") -> torch.Tensor:
    """Logits for ``x`` averaged over the views of ``level``:
    none: x; flip: x and its mirror; flip_translate: half weight on (x, mirror),
    half on the flip-averaged logits of the views shifted by one pixel up-left
    and down-right (reflect padding), as airbench does."""
    if level not in TTA_LEVELS:
        raise ValueError(f"Invalid TTA level {level!r}; accepted: {', '.join(TTA_LEVELS)}")
    if level == "none":
        return model(x)

    def with_flip(v: torch.Tensor) -> torch.Tensor:
        return 0.5 * model(v) + 0.5 * model(v.flip(-1))

    logits = with_flip(x)
    if level == "flip":
        return logits
    h, w = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    shifted = [padded[..., 0:h, 0:w], padded[..., 2:h + 2, 2:w + 2]]
    return 0.5 * logits + 0.5 * torch.stack([with_flip(v) for v in shifted]).mean(0)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], level: str = "none", *,
             bf16: bool = False, distributed: bool = False) -> float:
    """Top-1 accuracy of ``model`` (in eval mode, restored after) over
    ``(inputs, labels)`` batches, with the test-time augmentation ``level``.

    ``bf16``: run under :func:`hasten.nn.precision.autocast`. ``distributed``: the
    batches are this rank's share of the test set; the counts are summed over
    all torch.distributed ranks (every rank must call; pass the plain module, not
    DDP, whose forward is collective)."""
    was_training = model.training
    model.eval()
    correct, total, device = 0, 0, None
    for x, y in batches:
        with autocast(x.device, bf16):
            logits = tta_logits(model, x, level)
        # Summed on the device: a .item() per batch would sync every batch.
        correct = correct + (logits.argmax(1) == y).sum()
        total += len(y)
        device = x.device
    model.train(was_training)
    if distributed:
        if device is None:  # no batches on this rank: it still joins the sum
            device = next(model.parameters()).device
        counts = torch.stack([torch.as_tensor(correct, device=device), torch.tensor(total, device=device)])
        torch.distributed.all_reduce(counts)
        correct, total = counts.tolist()
    return float(correct) / max(total, 1)
