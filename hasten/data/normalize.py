"""Per-channel normalisation of uint8 images, shared by every loader and recipe.

``channel_stats`` measures the per-channel mean and std of a uint8 image set;
``normalize`` maps uint8 0..255 to ``(x / 255 - mean) / std`` in the requested
dtype and memory format. Changes the training math: no (a fixed affine map of
the input that every recipe applies the same way).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["channel_stats", "normalize"]


def normalize(images: torch.Tensor, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
              dtype: torch.dtype = torch.float32, *, channels_last: bool = False) -> torch.Tensor:
    """uint8 (N, C, H, W) in 0..255 -> ``dtype``, per-channel ``(x/255 - mean)/std``
    (mean and std in 0..1 units; pass tensors already on the images' device to
    avoid a host-to-device copy per call). ``channels_last`` returns NHWC memory."""
    m = torch.as_tensor(mean, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.as_tensor(std, device=images.device, dtype=torch.float32).view(1, -1, 1, 1)
    x = ((images.float() / 255 - m) / s).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images (N, C, H, W), in 0..1 units.
    Accumulated in float64 over chunks: no full-size float copy of the data set."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for i in range(0, len(images), chunk):
        x = images[i:i + chunk].to(torch.float64) / 255
        total += x.sum(dim=(0, 2, 3)).cpu()
        total_sq += (x * x).sum(dim=(0, 2, 3)).cpu()
    count = images.numel() / images.shape[1]
    mean = total / count
    std = (total_sq / count - mean * mean).clamp_min(0).sqrt()
    return mean.tolist(), std.tolist()
