"""``load_dataset(path)``: decide once what a path holds, then read it.

``resolve_source`` turns what the user gave into a ``Source``:

- ``None``: ``$HASTEN_DATA`` if set, else the canonical ``cifar-10-binary.tar.gz``
  downloaded (md5-verified) into the cache directory and extracted safely;
- a directory holding the CIFAR-10 ``*.bin`` batches, or an archive of them:
  kind "cifar10-binary", read by ``hasten.data.cifar10``;
- any other directory or archive (.tar, .tar.gz, .tar.xz, .tar.bz2, .zip): kind
  "image-folder" (``train/<class>/*`` and ``test/<class>/*``), read by
  ``hasten.data.image_folder``, which decodes once in parallel and caches the
  decoded tensors on disk, or streamed by ``hasten.stream.records``.

The readers take the ``Source`` and never guess again.
"""

from __future__ import annotations

import os
from pathlib import Path

from hasten.data.archive import ARCHIVE_SUFFIXES, archive_kind
from hasten.data.cifar10 import download_cifar10, is_cifar10_binary, read_cifar10_binary
from hasten.data.dataset import ImageDataset, Source
from hasten.data.image_folder import check_options, load_image_folder
from hasten.errors import DataError


def resolve_source(path: str | os.PathLike | None = None) -> Source:
    """The ``Source`` at ``path`` (see the module docstring); ``DataError`` if none is there."""
    origin = ""
    if path is None:
        env = os.environ.get("HASTEN_DATA")
        path = Path(env) if env else download_cifar10()
        origin = " (from HASTEN_DATA)" if env else ""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"dataset path {str(path)!r}{origin} does not exist (give a directory or an archive: "
                        f"{', '.join(ARCHIVE_SUFFIXES)})")
    container = archive_kind(path)
    if container is None:
        raise DataError(f"{str(path)!r}{origin} is not a directory or a supported archive "
                        f"({', '.join(ARCHIVE_SUFFIXES)})")
    kind = "cifar10-binary" if is_cifar10_binary(path, container) else "image-folder"
    return Source(kind, path, container)


def load_dataset(
    path: str | os.PathLike | None = None,
    *,
    image_size: int | None = None,
    max_bad_fraction: float = 0.01,
    workers: int | None = None,
    cache: bool = True,
) -> ImageDataset:
    """Load the dataset at ``path`` (see the module docstring for what it accepts).

    ``image_size``, ``max_bad_fraction``, ``workers`` and ``cache`` apply to image
    folders: resize-and-center-crop to SxS when sizes differ, the fraction of bad
    files tolerated before stopping, decoding processes (default: all cores), and
    whether to use the on-disk decode cache. Raises ``DataError`` with a one-line
    message for anything that cannot be used.
    """
    check_options(image_size=image_size, max_bad_fraction=max_bad_fraction, workers=workers)
    source = resolve_source(path)
    if source.kind == "cifar10-binary":
        return read_cifar10_binary(source)
    return load_image_folder(
        source, image_size=image_size, max_bad_fraction=max_bad_fraction, workers=workers, cache=cache
    )
