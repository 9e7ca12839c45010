"""The records every reader takes and returns: ``Source`` in, ``ImageDataset`` of two ``Split`` s out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from hasten.data.archive import archive_stem

SOURCE_KINDS = ("cifar10-binary", "image-folder")
CONTAINERS = ("dir", "tar", "zip")


@dataclass(frozen=True)
class Source:
    """Where a dataset is read from, decided once (``hasten.data.sources.resolve_source``).

    ``kind``: "cifar10-binary" (the canonical ``*.bin`` batches) or "image-folder"
    (``train/<class>/*``). ``container``: "dir", "tar" or "zip" (as
    ``hasten.data.archive.archive_kind`` names them).
    """

    kind: str
    path: Path
    container: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"Invalid source kind {self.kind!r}; accepted: {', '.join(SOURCE_KINDS)}")
        if self.container not in CONTAINERS:
            raise ValueError(f"Invalid container {self.container!r}; accepted: {', '.join(CONTAINERS)}")

    @property
    def name(self) -> str:
        """The folder's name, or the archive's without its suffix."""
        return self.path.resolve().name if self.container == "dir" else archive_stem(self.path)


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

    def subset(self, n: int, seed: int = 0) -> Split:
        """A seeded random subset of ``n`` examples, kept in their original order.
        Random rather than a prefix: image folders are stored class by class, so a
        prefix would miss whole classes."""
        if not 0 < n <= len(self):
            raise ValueError(f"subset size must be in 1..{len(self)}, got {n}")
        idx = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n].sort().values
        return Split(self.images[idx], self.labels[idx])


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

    def with_train_subset(self, n: int, seed: int = 0) -> ImageDataset:
        """The same dataset with a seeded random subset of ``n`` training images."""
        return replace(self, train=self.train.subset(n, seed))

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
            f"{self.num_classes} classes, {h}x{w} (from {_shown_path(self.source)}"
            f"{'; decode cache hit' if self.cached else ''})"
        )
        if self.skipped:
            text += f"; skipped {len(self.skipped)} bad file(s)"
        return text


def _shown_path(path) -> str:
    """``path`` as results may record it: relative to the working directory when that
    is short (``../shared/data/x.tar.xz``), else the file name alone, never a
    machine's absolute path."""
    import os

    text = str(path)
    if not os.path.isabs(text):
        return text
    rel = os.path.relpath(text)
    return rel if not rel.startswith("../..") else Path(text).name
