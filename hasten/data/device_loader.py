"""A device-resident data loader: the whole dataset lives on the accelerator.

From David Page's "How to train your ResNet" (part 2: per-batch host-side
preprocessing was the bottleneck; doing it once on the GPU cut 297 s to 70 s) and
Keller Jordan's airbench (dataset normalised once on the GPU, batched per-sample
augmentation, alternating flip). Per epoch the loader draws every random number it
needs for the whole dataset and augments the whole epoch in one gather (crop and
mirror together, in batch order) plus one in-place cutout; each batch is then a
slice of that epoch tensor: no per-batch copies, no host work, no worker processes.

Data-parallel use: every rank builds the same loader with the same ``seed`` and
its own ``rank``/``world_size``. All ranks then draw the same permutation and
augmentation parameters, and rank r takes rows [r*B, (r+1)*B) of each global batch
of ``B * world_size`` examples, so W ranks with batch B see exactly what one
process with batch W*B sees.

Changes the training math: no (it is how data is fed); the augmentations it
applies are training-math choices, see ``hasten.data.device_augment``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from hasten.data.device_augment import alternating_flip_mask, crop_flip, cutout_mask, random_shifts
from hasten.data.normalize import channel_stats, normalize

FLIP_MODES = ("none", "random", "alternating")


@dataclass(frozen=True)
class Augmentation:
    """Per-sample training augmentation. ``translate``: max shift in pixels (reflect
    padding); ``flip``: none|random|alternating; ``cutout``: square side, 0 = off."""

    translate: int = 0
    flip: str = "none"
    cutout: int = 0

    def __post_init__(self) -> None:
        if self.flip not in FLIP_MODES:
            raise ValueError(f"Invalid flip mode {self.flip!r}; accepted: {', '.join(FLIP_MODES)}")
        if self.translate < 0 or self.cutout < 0:
            raise ValueError(f"translate and cutout must be >= 0, got {self.translate}, {self.cutout}")


def check_loader_inputs(images: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
    """``ValueError`` unless images are uint8 (N, C, H, W) with N labels and ``batch_size`` >= 1."""
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"images must be a uint8 tensor (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    if labels.shape != (len(images),):
        raise ValueError(f"labels must have shape ({len(images)},), got {tuple(labels.shape)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"Invalid batch_size: {batch_size!r}")


def batches_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else -(-n // batch_size)


class GpuLoader:
    """Iterate ``(inputs, labels)`` batches of a device-resident dataset.

    images: uint8 tensor (N, C, H, W), labels: int64 (N,), on any device; both are
    moved to ``device`` once. ``batch_size`` is per rank. Each ``iter()`` is one
    epoch; the epoch counter also drives the alternating flip.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 device: torch.device | str = "cpu", shuffle: bool = True, drop_last: bool = True,
                 augment: Augmentation | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        check_loader_inputs(images, labels, batch_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"Invalid rank {rank} for world_size {world_size}")
        if len(images) < batch_size * world_size and drop_last:
            raise ValueError(f"{len(images)} examples cannot fill one global batch of {batch_size * world_size}")
        self.device = torch.device(device)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.augment = augment or Augmentation()
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.channels_last = channels_last
        if mean is None or std is None:
            mean, std = channel_stats(images)
        self.mean, self.std = list(mean), list(std)
        self.labels = labels.to(self.device)
        images = normalize(images.to(self.device), self.mean, self.std, dtype)
        pad = self.augment.translate
        # Pad once, not per epoch: cropping a padded copy is a pure gather. The
        # unpadded images are a view of its centre, not a second copy.
        self._padded = F.pad(images, (pad,) * 4, mode="reflect") if pad else images
        h, w = images.shape[-2:]
        self.images = self._padded[..., pad:pad + h, pad:pad + w]
        del images
        self._flip_base: torch.Tensor | None = None
        self.epoch = 0

    def __len__(self) -> int:
        return batches_per_epoch(len(self.labels), self.batch_size * self.world_size, self.drop_last)

    def _generator(self, epoch: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(self.seed * 1_000_003 + epoch)
        return g

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        n, aug = len(self.labels), self.augment
        g = self._generator(epoch)
        order = torch.randperm(n, generator=g, device=self.device) if self.shuffle else torch.arange(n, device=self.device)
        shifts = random_shifts(n, aug.translate, generator=g, device=self.device) if aug.translate else None
        if aug.flip == "random":
            flips = torch.rand(n, generator=g, device=self.device) < 0.5
        elif aug.flip == "alternating":
            if self._flip_base is None:
                self._flip_base = torch.rand(n, generator=self._generator(-1), device=self.device) < 0.5
            flips = alternating_flip_mask(self._flip_base, epoch)
        else:
            flips = None
        if aug.cutout:
            h, w = self.images.shape[-2:]
            centers = torch.stack([torch.randint(0, h, (n,), generator=g, device=self.device),
                                   torch.randint(0, w, (n,), generator=g, device=self.device)], 1)
        # This rank's examples in batch order: batch i is positions [a, b) of ``order``.
        global_batch = self.batch_size * self.world_size
        spans = []
        for i in range(len(self)):
            a = i * global_batch + self.rank * self.batch_size
            spans.append((a, max(a, min(a + self.batch_size, n))))
        mine = torch.cat([order[a:b] for a, b in spans]) if self.world_size > 1 else order[:spans[-1][1]]
        # The whole epoch augmented at once, as airbench does: one gather (crop and
        # mirror), then cutout in place on that fresh tensor.
        x = crop_flip(self._padded, aug.translate, shifts[mine] if shifts is not None else None,
                      flips[mine] if flips is not None else None, index=mine)
        if aug.cutout:
            x.masked_fill_(cutout_mask(centers[mine], aug.cutout, *x.shape[-2:]), 0)
        # Already channels-last from the gather: a copy only for a channels-first layout.
        x = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        y = self.labels[mine]
        start = 0
        for a, b in spans:
            yield x[start:start + b - a], y[start:start + b - a]
            start += b - a
