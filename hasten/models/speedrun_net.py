"""The CIFAR-10 speedrun network, with every architectural trick switchable.

Architecture from Keller Jordan's airbench94 (2024), itself a descendant of
David Page's ResNet-9 ("How to train your ResNet", 2018): a first 2x2 convolution
(the whitening layer), three conv groups of [conv, max-pool, BN, act, conv, BN,
act], a global max-pool, a linear head and a fixed logit scale.

Switches, each one a rung of the ablation ladder:
- ``pool_before_act``: conv -> pool -> BN -> act (Page part 4: BN and activation
  run on a quarter of the pixels) instead of conv -> BN -> act -> pool.
- ``activation``: relu | celu (Page: CELU(alpha=0.075), smoother) | gelu (airbench).
- ``ghost_batch_size``: ghost batch norm over chunks of this many images (Page
  part 7: 32); 0 = plain batch norm.
- ``freeze_bn_scale``: BN weight fixed at 1, only the bias trains (Page part 7).
- ``dirac_init``: conv weights start as identity on the first in_channels filters
  (airbench), so a fresh network passes its input through.
The first layer's bias starts at zero (airbench). The whitening initialisation
itself is applied by the recipe
(``hasten.nn.whitening.init_whitening_conv``) because it needs the data.

Changes the training math: yes, every switch is an architecture or init choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hasten.nn.ghost_bn import GhostBatchNorm2d

ACTIVATIONS = ("relu", "celu", "gelu")


@dataclass(frozen=True)
class NetConfig:
    widths: tuple[int, int, int] = (64, 256, 256)  # channels of the three conv groups
    whiten_kernel: int = 2           # first conv: kernel k, 2*3*k*k output channels
    activation: str = "gelu"
    pool_before_act: bool = True
    bn_momentum: float = 0.6         # airbench convention: running = 0.6*running + 0.4*batch
    bn_eps: float = 1e-12
    freeze_bn_scale: bool = True
    ghost_batch_size: int = 0        # images per ghost BN chunk; 0 = plain batch norm
    dirac_init: bool = True
    logit_scale: float = 1 / 9       # fixed multiplier on the logits (Page's 0.125)
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Invalid activation {self.activation!r}; accepted: {', '.join(ACTIVATIONS)}")
        if len(self.widths) != 3 or min(self.widths) < 1:
            raise ValueError(f"widths must be three positive ints, got {self.widths}")
        if self.ghost_batch_size < 0:
            raise ValueError(f"ghost_batch_size must be >= 0, got {self.ghost_batch_size}")
        if self.whiten_kernel < 1:
            raise ValueError(f"whiten_kernel must be >= 1, got {self.whiten_kernel}")


def make_activation(name: str) -> nn.Module:
    if name == "relu":
        return nn.ReLU(inplace=True)
    if name == "celu":
        return nn.CELU(alpha=0.075)
    return nn.GELU()


class Conv(nn.Conv2d):
    """3x3 'same' convolution without bias, optionally identity (dirac) initialised."""

    def __init__(self, cin: int, cout: int, dirac: bool) -> None:
        self.dirac = dirac
        super().__init__(cin, cout, kernel_size=3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.dirac:
            w = self.weight.data
            torch.nn.init.dirac_(w[: w.size(1)])


def make_batchnorm(channels: int, cfg: NetConfig) -> nn.BatchNorm2d:
    kwargs = dict(eps=cfg.bn_eps, momentum=1 - cfg.bn_momentum)
    if cfg.ghost_batch_size:
        bn = GhostBatchNorm2d(channels, cfg.ghost_batch_size, **kwargs)
    else:
        bn = nn.BatchNorm2d(channels, **kwargs)
    bn.weight.requires_grad_(not cfg.freeze_bn_scale)
    return bn


class ConvGroup(nn.Module):
    def __init__(self, cin: int, cout: int, cfg: NetConfig) -> None:
        super().__init__()
        self.pool_before_act = cfg.pool_before_act
        self.conv1 = Conv(cin, cout, cfg.dirac_init)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = make_batchnorm(cout, cfg)
        self.conv2 = Conv(cout, cout, cfg.dirac_init)
        self.norm2 = make_batchnorm(cout, cfg)
        self.activ = make_activation(cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        if self.pool_before_act:
            x = self.activ(self.norm1(self.pool(x)))
        else:
            x = self.pool(self.activ(self.norm1(x)))
        return self.activ(self.norm2(self.conv2(x)))


class SpeedrunNet(nn.Module):
    def __init__(self, cfg: NetConfig = NetConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        k = cfg.whiten_kernel
        w1, w2, w3 = cfg.widths
        self.whiten = nn.Conv2d(3, 2 * 3 * k * k, kernel_size=k, padding=0, bias=True)
        # Its bias starts at zero, as in airbench, also where the layer is not
        # whitened (ladder rungs); PyTorch's default would be uniform noise.
        nn.init.zeros_(self.whiten.bias)
        self.activ = make_activation(cfg.activation)
        self.layers = nn.Sequential(
            ConvGroup(2 * 3 * k * k, w1, cfg),
            ConvGroup(w1, w2, cfg),
            ConvGroup(w2, w3, cfg),
        )
        self.head = nn.Linear(w3, cfg.num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.activ(self.whiten(x)))
        x = torch.amax(x, dim=(2, 3))  # global max-pool
        return self.head(x) * self.cfg.logit_scale
