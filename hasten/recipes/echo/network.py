"""The echo recipes' network and input statistics: ``SmallNet`` (fast enough to train on
a CPU), the formats it runs in per device (``fast_formats``), and CIFAR-10-JPEG's
per-channel ``MEAN`` and ``STD``.

Used by ``hasten.recipes.echo.run`` and the sweep (``hasten.recipes.echo.budget``,
``hasten.recipes.echo.data``). Changes the training math: no (it is the model trained).
"""

from __future__ import annotations

import torch
from torch import nn

# Per-channel mean and std (RGB) of the 50,000 decoded CIFAR-10-JPEG training images, measured
# in 0-255 units; 0..1 here.
MEAN = tuple(v / 255 for v in (125.27, 122.93, 113.86))
STD = tuple(v / 255 for v in (62.53, 61.91, 66.46))


class SmallNet(nn.Sequential):
    """Three conv-BN-ReLU-maxpool stages and a linear head: fast enough to train on a CPU."""

    def __init__(self, width: int = 16, num_classes: int = 10):
        layers, cin = [], 3
        for cout in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            cin = cout
        super().__init__(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


def fast_formats(device: torch.device | str) -> tuple[torch.memory_format, bool]:
    """(memory format, bf16 autocast) for ``device``: channels_last and bf16 on CUDA,
    where tensor cores want both; contiguous float32 elsewhere (on a CPU bf16
    convolutions are slower than float32)."""
    cuda = torch.device(device).type == "cuda"
    return (torch.channels_last if cuda else torch.contiguous_format), cuda


def mean_std_on(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD as tensors on ``device``, for :func:`hasten.data.normalize.normalize`."""
    return torch.tensor(MEAN, device=device), torch.tensor(STD, device=device)
