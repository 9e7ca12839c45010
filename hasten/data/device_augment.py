"""Batched, on-device data augmentation for image tensors (N, C, H, W).

Every function works on a whole batch at once, on whatever device the batch is
on, with per-sample random parameters drawn from a ``torch.Generator``. Doing the
augmentation on the accelerator is the first rung of David Page's ladder ("How to
train your ResNet, part 2": moving preprocessing to the GPU, 297 s -> 70 s);
alternating flip is from Keller Jordan's airbench (2024).

Changes the training math: these *are* training-math choices (data
augmentation); they change what the network sees, not how gradients are formed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shifts(n: int, max_shift: int, *, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, 2) integer shifts (dy, dx), each uniform in [-max_shift, max_shift]."""
    return torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator, device=device)


def crop_flip(padded: torch.Tensor, pad: int, shifts: torch.Tensor | None = None,
              flips: torch.Tensor | None = None, index: torch.Tensor | None = None) -> torch.Tensor:
    """Translate and mirror a batch in one gather: row i of the result is image
    ``index[i]`` of ``padded`` (padded by ``pad`` on every side; all images when
    ``index`` is None) cropped back to its original size at offset ``shifts[i]``
    (dy, dx) and then mirrored left-right where ``flips[i]``:
    ``out[i, :, y, x] == padded[index[i], :, pad+dy+y, pad+dx+x']`` with
    ``x' = w-1-x`` when mirrored, else ``x``. ``shifts`` and ``flips`` are per
    output row (None: no shift, no mirror).

    The mirror is folded into the column index, so crop and flip cost one pass
    over the data instead of a crop, a flip and a select. The result is laid out
    channels-last (it is gathered as (n, h, w, c) and viewed as (n, c, h, w)):
    ``.contiguous()`` it where a channels-first layout is needed."""
    n_all, _, hp, wp = padded.shape
    h, w = hp - 2 * pad, wp - 2 * pad
    dev = padded.device
    if index is None:
        index = torch.arange(n_all, device=dev)
    n = len(index)
    ys, xs = torch.arange(h, device=dev), torch.arange(w, device=dev)
    rows = (ys + pad).expand(n, h)  # (n, h)
    cols = xs.expand(n, w)  # (n, w)
    if flips is not None:
        cols = torch.where(flips[:, None], (w - 1) - xs, xs)
    cols = cols + pad
    if shifts is not None:
        rows = rows + shifts[:, 0:1]
        cols = cols + shifts[:, 1:2]
    # Advanced indexing puts the indexed dims first: (n, h, w, c); its NCHW view is channels-last.
    out = padded.permute(0, 2, 3, 1)[index[:, None, None], rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2)


def crop_with_shifts(padded: torch.Tensor, shifts: torch.Tensor, pad: int) -> torch.Tensor:
    """Crop each padded image (padded by ``pad`` on every side) back to its original
    size, offset by its own shift: ``out[i, :, y, x] == padded[i, :, pad+dy+y, pad+dx+x]``.

    One gather for the whole batch: no Python loop over samples.
    """
    return crop_flip(padded, pad, shifts).contiguous()


def random_crop_reflect(x: torch.Tensor, pad: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random translation by up to ``pad`` pixels with reflect padding (random crop
    of the reflect-padded image back to the original size)."""
    if pad <= 0:
        return x
    padded = F.pad(x, (pad,) * 4, mode="reflect")
    return crop_with_shifts(padded, random_shifts(len(x), pad, generator=generator, device=x.device), pad)


def flip_where(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror (left-right) the samples where ``mask`` is true."""
    return torch.where(mask.view(-1, 1, 1, 1), x.flip(-1), x)


def random_flip(x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each sample independently with probability 1/2."""
    return flip_where(x, torch.rand(len(x), generator=generator, device=x.device) < 0.5)


def alternating_flip_mask(base_mask: torch.Tensor, epoch: int) -> torch.Tensor:
    """airbench's alternating flip: a random flip decision per sample on even epochs
    and its negation on odd ones, so every image is seen both ways in every two
    epochs (less redundancy than independent coin flips)."""
    return base_mask ^ bool(epoch % 2)


def cutout(x: torch.Tensor, size: int, *, generator: torch.Generator | None = None,
           centers: torch.Tensor | None = None) -> torch.Tensor:
    """Zero a ``size`` x ``size`` square per sample (DeVries & Taylor, 2017), centred
    uniformly in the image and clipped at its borders. Returns a new tensor."""
    if size <= 0:
        return x
    n, _, h, w = x.shape
    if centers is None:
        cy = torch.randint(0, h, (n,), generator=generator, device=x.device)
        cx = torch.randint(0, w, (n,), generator=generator, device=x.device)
        centers = torch.stack([cy, cx], 1)
    return x.masked_fill(cutout_mask(centers, size, h, w), 0)


def cutout_mask(centers: torch.Tensor, size: int, h: int, w: int) -> torch.Tensor:
    """(n, 1, h, w) bool: true inside each sample's ``size`` x ``size`` square
    (top-left corner at ``centre - size // 2``, clipped at the borders)."""
    top = centers[:, 0:1] - size // 2
    left = centers[:, 1:2] - size // 2
    ys = torch.arange(h, device=centers.device)
    xs = torch.arange(w, device=centers.device)
    in_rows = (ys >= top) & (ys < top + size)  # (n, h)
    in_cols = (xs >= left) & (xs < left + size)  # (n, w)
    return (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)
