"""ResNets for ``hasten train``: ResNet-18/34 (basic blocks) and ResNet-50
(bottleneck blocks), with a CIFAR stem (3x3 conv, no pooling) or the ImageNet stem
(7x7 stride-2 conv and max pooling), and a width knob for small experiments.

Based on: K. He et al., "Deep Residual Learning for Image Recognition"
(arXiv:1512.03385), in the "v1.5" form used by torchvision and the MLPerf
reference (stride on the 3x3 conv of a bottleneck). The last batch norm of each
residual branch starts at zero (Goyal et al., arXiv:1706.02677, section 5.1), so
every block starts as the identity, which helps large-batch warm-up.

Changes the training math: no (a model definition).
"""

from __future__ import annotations

from torch import Tensor, nn

from hasten.errors import ConfigError

__all__ = ["ResNet", "build_model", "MODELS"]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn2.weight)
        self.shortcut = _shortcut(cin, cout, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn3.weight)
        self.shortcut = _shortcut(cin, cout, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """``layers`` blocks per stage; stage widths ``width * (1, 2, 4, 8)``."""

    def __init__(self, block: type, layers: list[int], num_classes: int,
                 stem: str = "cifar", width: int = 64):
        super().__init__()
        if stem == "cifar":
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
            )
        elif stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            raise ConfigError(f"unknown stem {stem!r}; choose 'cifar' or 'imagenet'")
        stages, cin = [], width
        for i, n in enumerate(layers):
            w = width * 2**i
            for j in range(n):
                stages.append(block(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * block.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.stages(self.stem(x))).flatten(1))


# name -> (block, blocks per stage)
MODELS = {
    "resnet10": (BasicBlock, [1, 1, 1, 1]),
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


def build_model(name: str, num_classes: int, image_size: int, width: int = 64) -> ResNet:
    """A ResNet by name; the stem follows the image size (ImageNet stem from 64 px
    up, where the 4x early downsampling pays for itself)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    if width < 1:
        raise ConfigError(f"invalid width {width}: must be >= 1")
    block, layers = MODELS[name]
    stem = "imagenet" if image_size >= 64 else "cifar"
    return ResNet(block, layers, num_classes, stem=stem, width=width)
