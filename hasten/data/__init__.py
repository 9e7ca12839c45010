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
from pathlib import Path

from hasten.data.dataset import ImageDataset, Split
from hasten.errors import DataError


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
