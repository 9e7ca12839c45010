"""What ``hasten train`` reads, whichever loader feeds it: the decoded dataset
resident on the device (``device_input``), or the streaming pipeline for data larger
than memory (``stream_input``: tar shards, their URL, an image folder or an archive),
each as a ``TrainInput`` the training loop consumes.

Changes the training math: no (the same augmentation family; which loader reads
the data does not change the recipe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import Tensor

from hasten.data.archive import archive_stem
from hasten.data.device_loader import Augmentation, GpuLoader
from hasten.data.normalize import channel_stats, normalize
from hasten.errors import ConfigError
from hasten.recipes.training_data import load_training_data

# Normalisation for streamed data, which is never seen whole: the usual ImageNet statistics.
STREAM_MEAN, STREAM_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Images whose shorter side reaches this (ImageNet's training size) are photos to crop regions of.
LARGE_IMAGES = 224


class StreamNormalizer:
    """``hasten.data.normalize.normalize`` for streamed batches, as one kernel per batch.

    The map is the same, ``(x / 255 - mean) / std``, written ``x * scale + shift``
    with ``scale = 1 / (255 std)`` and ``shift = -mean / std`` folded once on the
    device: one ``addcmul`` reads the uint8 batch and writes float32 (``normalize``
    makes four elementwise passes; on the CPU torch casts the input first), and no
    constant crosses the bus per step (``normalize`` given host values copies mean and
    std to the device, blocking, every call). The loaders already copied the uint8
    batch from pinned memory, non-blocking. ``channels_last``: NHWC memory, else
    contiguous NCHW whatever layout the decoder produced (decoded batches are NHWC
    views; an NCHW model fed them converts its weights at every convolution).
    Changes the training math: no (the same affine map; float32 rounding differs
    in the last bit).
    """

    def __init__(self, mean, std, device, *, channels_last: bool = False):
        mean64 = torch.tensor(mean, dtype=torch.float64)
        std64 = torch.tensor(std, dtype=torch.float64)
        self.scale = (1 / (255 * std64)).to(device=device, dtype=torch.float32).view(1, -1, 1, 1)
        self.shift = (-mean64 / std64).to(device=device, dtype=torch.float32).view(1, -1, 1, 1)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: Tensor) -> Tensor:
        out = torch.empty(images.shape, dtype=torch.float32, device=images.device, memory_format=self.memory_format)
        return torch.addcmul(self.shift, images, self.scale, out=out)


@dataclass(frozen=True)
class TrainInput:
    """What the training loop reads, whichever loader feeds it."""
    epoch_batches: Callable[[int], Iterator[tuple[Tensor, Tensor]]]  # epoch -> this rank's batches
    steps_per_epoch: int
    test_batches: Callable[[], Iterator[tuple[Tensor, Tensor]]]  # this rank's share of the test set
    num_classes: int
    image_size: int
    name: str
    # This rank's position in the data, when the loader keeps one beyond (seed, epoch, step):
    # an object with state_dict() / load_state_dict(), stored in checkpoints per rank.
    position: object | None = field(default=None)

    def batches_from(self, step: int, total_steps: int, positioned: bool) -> Iterator[tuple[Tensor, Tensor]]:
        """The run's batches from ``step`` to ``total_steps``, each epoch in its order, one per
        step; resumed mid-epoch, the epoch's steps done are skipped, unless the loader resumed
        at its own ``position`` (``positioned``)."""
        while step < total_steps:
            skip = 0 if positioned else step % self.steps_per_epoch
            positioned = False
            for i, (x, y) in enumerate(self.epoch_batches(step // self.steps_per_epoch)):
                if i >= skip:
                    yield x, y
                    step += 1


def device_input(cfg, dataset, device, rank, world, local_batch) -> TrainInput:
    """The decoded dataset resident on the device (``GpuLoader``)."""
    ds = load_training_data(cfg.data, batch_size=cfg.batch_size, train_subset=cfg.train_subset,
                            image_size=cfg.image_size, dataset=dataset)
    size = ds.train.images.shape[-1]
    mean, std = channel_stats(ds.train.images)
    # On the device once: normalize() would copy lists to the device for every test batch.
    mean_t, std_t = (torch.tensor(v, dtype=torch.float32, device=device) for v in (mean, std))
    loader = GpuLoader(
        ds.train.images, ds.train.labels, local_batch, device=device, shuffle=True, drop_last=True,
        # Standard CIFAR/ImageNet-style light augmentation: 1/8-image shifts and flips.
        augment=Augmentation(translate=max(1, size // 8), flip="random"),
        mean=mean, std=std, channels_last=cfg.channels_last, seed=cfg.seed, rank=rank, world_size=world,
    )

    def epoch_batches(epoch):
        loader.epoch = epoch  # the order and augmentation depend on (seed, epoch) only
        return iter(loader)

    def test_batches(batch_size=1000):
        x, y = ds.test.images, ds.test.labels
        for start in range(rank * batch_size, len(y), world * batch_size):
            images = x[start:start + batch_size].to(device, non_blocking=True)
            yield (normalize(images, mean_t, std_t, channels_last=cfg.channels_last),
                   y[start:start + batch_size].to(device))

    return TrainInput(epoch_batches, len(loader), test_batches, ds.num_classes, size, ds.name)


def stream_input(cfg, device, rank, world, local_batch) -> TrainInput:
    """Streamed (``hasten.stream.shard_loader.ShardLoader`` over ``hasten.stream.sources.open_source``):
    tar shards (``hasten data pack``; a directory or a URL), an image folder or an archive,
    for datasets that do not fit in memory (ImageNet). Each rank reads its own share, never
    the whole set, decoded in ``cfg.workers`` processes at ``cfg.image_size`` (default 224,
    or the images' own size when smaller). Packed shards, and folders or archives of images at
    least 224 px: fused JPEG decode + random-resized crop and flip, evaluation on the centre
    crop; a folder or archive of smaller images: the whole image with a random crop padded by
    4 and a flip, evaluation on the whole image. The loader is the ``position`` kept in checkpoints:
    after ``load_state_dict`` the next epoch's batches are the rest of the saved epoch."""
    from hasten.stream.chunk_decode import default_image_size
    from hasten.stream.retry import RetryPolicy
    from hasten.stream.shard_loader import ShardLoader
    from hasten.stream.shard_store import is_shard_dir
    from hasten.stream.sources import open_source

    # A URL: each request retried --retries times (hasten.stream.remote_store); local files ignore it.
    retry = RetryPolicy(retries=cfg.retries, flag="--retries")
    train_shards, test_shards = (open_source(cfg.data, split, retry=retry) for split in ("train", "test"))
    # Without --image-size: 224, or the images' own size when smaller (32 px CIFAR-10 is not upsampled).
    native = default_image_size(train_shards, largest=LARGE_IMAGES)
    size = cfg.image_size or native
    # Photos (a folder or archive of ImageNet's kind, or packed shards): the fused region decode and
    # random-resized crop, so that a user need not pack a folder to get it. Small images in a folder
    # or archive (CIFAR-10's 32 px): the whole image, a padded random crop and a flip, as before.
    photos = is_shard_dir(cfg.data) or native >= LARGE_IMAGES
    train_crop, test_crop = ("random-resized", "center") if photos else ("pad-crop", "whole")
    if not train_shards.classes:
        raise ConfigError(f"{cfg.data}: no class names (index.json); pack the data with `hasten data pack`")
    # Every rank must take the same number of steps: ranks' ranges differ by up to one image.
    steps_per_epoch = train_shards.total // world // local_batch
    if steps_per_epoch < 1:
        raise ConfigError(f"the training set has {train_shards.total} images, fewer than one global batch "
                          f"of {cfg.batch_size}")
    common = dict(image_size=size, rank=rank, world_size=world, seed=cfg.seed, workers=cfg.workers, device=device)
    loader = ShardLoader(train_shards, batch_size=local_batch, train=True, crop=train_crop, drop_last=True, **common)
    norm = StreamNormalizer(STREAM_MEAN, STREAM_STD, device, channels_last=cfg.channels_last)

    def epoch_batches(epoch):
        loader.set_epoch(epoch)
        done = loader.position // local_batch  # batches of this epoch delivered before a resume
        for i, (x, y) in enumerate(loader, start=done):
            if i >= steps_per_epoch:
                break
            yield norm(x), y

    def test_batches():
        for x, y in ShardLoader(test_shards, batch_size=250, train=False, crop=test_crop, **common):
            yield norm(x), y

    return TrainInput(epoch_batches, steps_per_epoch, test_batches, len(train_shards.classes), size,
                      packed_name(cfg.data, getattr(train_shards, "source", None)), position=loader)


def packed_name(path, source: str | None = None) -> str:
    """The name results give a packed set: what ``hasten data pack`` packed it from (its
    index's ``source`` without the archive suffix: ``cifar10-jpeg``), not the folder the
    shards were written to; that folder's name when no index says. ``source``: the index's,
    already read (a URL's store holds it)."""
    if source is None and "://" in str(path):
        return str(path).rstrip("/").rsplit("/", 1)[-1]
    if source is None:
        try:
            source = json.loads((Path(path) / "index.json").read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            source = None
    return archive_stem(source) if isinstance(source, str) and source else Path(path).resolve().name
