"""Patch whitening: a first convolution initialised from the data's patch covariance.

From David Page, "How to train your ResNet, part 8" (3x3 PCA whitening of input
patches as a fixed first layer: 36 s -> 26 s on the way to 94%), and Keller
Jordan's airbench (2x2 patches; the layer holds both +v and -v for every
eigenvector so the activation after it loses nothing; its bias trains for the
first epochs and is then frozen).

Changes the training math: yes. The first layer is set to W = [V / sqrt(lambda + eps);
-V / sqrt(lambda + eps)] from the eigen-decomposition of the patch covariance and
its weight is not trained, so the rest of the network sees decorrelated,
unit-variance patch features from step one.
"""

from __future__ import annotations

import torch
from torch import nn


def extract_patches(images: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """All (C, k, k) patches with stride 1: (N * (H-k+1) * (W-k+1), C, k, k)."""
    c = images.shape[1]
    patches = images.unfold(2, kernel_size, 1).unfold(3, kernel_size, 1)  # N, C, h, w, k, k
    return patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c, kernel_size, kernel_size)


def whitening_filters(images: torch.Tensor, kernel_size: int = 2, eps: float = 5e-4) -> torch.Tensor:
    """Filters (2*C*k*k, C, k, k) whose first half maps patches to decorrelated,
    unit-variance coordinates (PCA whitening without centring, as airbench does;
    the layer's bias absorbs the mean) and whose second half is the negation."""
    patches = extract_patches(images.float(), kernel_size)
    n, c, k, _ = patches.shape
    flat = patches.reshape(n, -1).double()  # float64: the small eigenvalues matter
    covariance = flat.T @ flat / n
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    # Largest eigenvalue first: the leading channels carry the most variance.
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    filters = (eigenvectors.T / torch.sqrt(eigenvalues.clamp_min(0) + eps)[:, None]).reshape(c * k * k, c, k, k)
    return torch.cat([filters, -filters]).float()


def init_whitening_conv(conv: nn.Conv2d, images: torch.Tensor, eps: float = 5e-4) -> None:
    """Set ``conv`` (out_channels = 2*C*k*k, kernel k, no padding) to the whitening
    filters of ``images`` (normalised float (N, C, H, W); a few thousand suffice),
    freeze its weight and zero its bias (as airbench initialises it; the bias may
    then train, to absorb the patch mean)."""
    k = conv.kernel_size[0]
    expected = 2 * conv.in_channels * k * k
    if conv.out_channels != expected or conv.kernel_size[0] != conv.kernel_size[1]:
        raise ValueError(f"whitening conv needs a square kernel and {expected} output channels, "
                         f"got {conv.out_channels} channels and kernel {tuple(conv.kernel_size)}")
    with torch.no_grad():
        conv.weight.copy_(whitening_filters(images.to(conv.weight.device), k, eps).to(conv.weight.dtype))
        if conv.bias is not None:
            conv.bias.zero_()
    conv.weight.requires_grad_(False)
