"""A host-side data loader: each batch prepared on the CPU, then copied to the device.

The "before" of the first rung of David Page's ladder ("How to train your
ResNet", part 2: per-batch host preprocessing cost 297 s where doing it once on
the GPU took 70 s), kept for the ablation against ``GpuLoader``
(``hasten.data.device_loader``), whose arguments and batches it shares. Data
stays uint8 in host memory; each batch is gathered, cropped and flipped
(``hasten.data.host_augment.crop_flip``, as the streaming pipeline does),
normalised and cut out on the CPU, then copied (pinned and non-blocking on CUDA).
Alternating flip is treated as random flip here.

Changes the training math: no (it is how data is fed); the augmentations are
the training-math choices of ``Augmentation``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

from hasten.data.device_augment import cutout
from hasten.data.device_loader import Augmentation, batches_per_epoch, check_loader_inputs
from hasten.data.host_augment import crop_flip
from hasten.data.normalize import channel_stats, normalize


class HostLoader:
    """Iterate ``(inputs, labels)`` batches like ``GpuLoader`` (single process),
    preparing each batch on the host. Each ``iter()`` is one epoch.

    Args:
        images: the dataset decoded once, a uint8 tensor (N, C, H, W) of values 0-255
            (``hasten.data.sources.load_dataset(path).train.images``); kept in host memory.
        labels: int64 tensor (N,), one class index per image.
        batch_size: examples per batch.
        device: where each batch is copied (pinned and non-blocking on CUDA).
        shuffle: a new random order every epoch (seeded by ``seed`` and the epoch).
        drop_last: leave out the last, smaller batch of an epoch.
        augment: per-batch random augmentation (``hasten.data.device_loader.Augmentation``):
            a shift of up to ``translate`` pixels (reflect padding), a random flip, cutout.
            The default, ``Augmentation()``, does none of them: pass one to crop and flip.
        mean, std: per-channel statistics to normalise by, in 0-1 units (ImageNet's: mean
            (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)); by default the images' own
            (``hasten.data.normalize.channel_stats``).
        dtype: of the inputs handed out (labels stay int64).
        channels_last: hand out inputs in channels-last memory format.
        seed: the order's and the augmentation's random seed.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 device: torch.device | str = "cpu", shuffle: bool = True, drop_last: bool = True,
                 augment: Augmentation | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, seed: int = 0) -> None:
        check_loader_inputs(images, labels, batch_size)
        self.images, self.labels = images.cpu(), labels.cpu()
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.augment = augment or Augmentation()
        if mean is None or std is None:
            mean, std = channel_stats(images)
        self.mean, self.std = list(mean), list(std)
        # Built once: normalising a batch then costs no tensor construction.
        self._mean, self._std = torch.tensor(self.mean), torch.tensor(self.std)
        self.device, self.dtype = torch.device(device), dtype
        self.channels_last, self.seed, self.epoch = channels_last, seed, 0

    def __len__(self) -> int:
        return batches_per_epoch(len(self.labels), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        rng = np.random.default_rng([self.seed, epoch])
        aug = self.augment
        order = torch.randperm(len(self.labels), generator=g) if self.shuffle else torch.arange(len(self.labels))
        pin = self.device.type == "cuda"
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            x = self.images[idx]
            if aug.translate or aug.flip != "none":
                nhwc = crop_flip(x.permute(0, 2, 3, 1).numpy(), rng, pad=aug.translate, flip=aug.flip != "none")
                x = torch.from_numpy(nhwc).permute(0, 3, 1, 2)
            x = cutout(normalize(x, self._mean, self._std), aug.cutout, generator=g)
            if pin:
                x = x.pin_memory()
            x = x.to(self.device, self.dtype, non_blocking=True)
            x = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
            yield x, self.labels[idx].to(self.device, non_blocking=True)
