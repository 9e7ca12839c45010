"""Datasets as uint8 tensors: canonical CIFAR-10 and image folders.

``load_dataset(path)`` is the one entry point:

- ``None``: ``$HASTEN_DATA`` if set, else the canonical ``cifar-10-binary.tar.gz``
  downloaded (md5-verified) into the cache directory, extracted safely and parsed.
- a directory holding the CIFAR-10 ``*.bin`` batches, or an archive of them: the
  canonical binary parser (``hasten.data.cifar10``).
- anything else, a directory or an archive (.tar, .tar.gz, .tar.xz, .zip) with
  ``train/<class>/*`` and ``test/<class>/*``: the image-folder reader
  (``hasten.data.image_folder``), which decodes once in parallel and caches the
  decoded tensors on disk.

The package import stays light: the readers are imported on first use, and
sibling modules (augmentation, loaders, streaming) are imported by their users.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hasten.errors import DataError


@dataclass(frozen=True)
class Split:
    """One split of a dataset, held in memory.

    ``images``: uint8 tensor (N, 3, H, W), channels first, RGB, values 0-255.
    ``labels``: int64 tensor (N,), indices into ``ImageDataset.classes``.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4 or self.images.shape[1] != 3:
            raise ValueError(
                f"Split.images must be uint8 (N, 3, H, W), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"Split.labels must be int64 (N,) with N={self.images.shape[0]}, "
                f"got {self.labels.dtype} {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]


@dataclass
class ImageDataset:
    """A train and a test split with class names and provenance.

    ``name``: "CIFAR-10" (canonical binary), "CIFAR-10-JPEG" (the ten CIFAR-10
    classes stored as JPEG: lossy, never report it as "CIFAR-10"), otherwise the
    folder or archive stem. ``skipped``: (file, reason) for every file that could
    not be used. ``cached``: True when the tensors came from the decode cache.
    """

    name: str
    classes: list[str]
    train: Split
    test: Split
    source: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    cached: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.train.images.shape[2:])

    def summary(self) -> str:
        h, w = self.image_size
        text = (
            f"{self.name}: {len(self.train)} train / {len(self.test)} test images, "
            f"{self.num_classes} classes, {h}x{w} (from {self.source}"
            f"{'; decode cache hit' if self.cached else ''})"
        )
        if self.skipped:
            text += f"; skipped {len(self.skipped)} bad file(s)"
        return text


def load_dataset(
    path: str | os.PathLike | None = None,
    *,
    image_size: int | None = None,
    max_bad_fraction: float = 0.01,
    workers: int | None = None,
    cache: bool = True,
) -> ImageDataset:
    """Load a dataset from ``path`` (see the module docstring for what it accepts).

    ``image_size``, ``max_bad_fraction``, ``workers`` and ``cache`` apply to image
    folders: resize-and-center-crop to SxS when sizes differ, the fraction of bad
    files tolerated before stopping, decoding processes (default: all cores), and
    whether to use the on-disk decode cache. Raises ``DataError`` with a one-line
    message for anything that cannot be used.
    """
    from hasten.data import cifar10, image_folder

    origin = ""
    if path is None:
        env = os.environ.get("HASTEN_DATA")
        path = Path(env) if env else cifar10.download_cifar10()
        origin = " (from HASTEN_DATA)" if env else ""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"dataset path {str(path)!r}{origin} does not exist (give a directory or an archive: "
                        ".tar, .tar.gz, .tar.xz, .zip)")
    if cifar10.is_cifar10_binary(path):
        return cifar10.read_cifar10_binary(path)
    return image_folder.load_image_folder(
        path, image_size=image_size, max_bad_fraction=max_bad_fraction, workers=workers, cache=cache
    )


__all__ = ["ImageDataset", "Split", "load_dataset"]
