"""Canonical CIFAR-10: download, verify, extract safely, parse the binary format.

Source: Krizhevsky, "Learning Multiple Layers of Features from Tiny Images"
(2009), https://www.cs.toronto.edu/~kriz/cifar.html. The "binary version"
archive holds ``cifar-10-batches-bin/data_batch_{1..5}.bin`` (10,000 records
each), ``test_batch.bin`` (10,000) and ``batches.meta.txt`` (class names, one a
line). A record is 1 label byte followed by 3,072 pixel bytes: the 1,024 red,
then green, then blue values of a 32x32 image, row-major, i.e. CHW already.
It is parsed with numpy directly; the pickled "python version" is never used,
since unpickling a downloaded file can run arbitrary code.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from hasten.data.archive import iter_files, safe_extract
from hasten.data.dataset import ImageDataset, Source, Split
from hasten.data.cache import cache_dir
from hasten.data.download import download
from hasten.errors import DataError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
ARCHIVE_NAME = "cifar-10-binary.tar.gz"
BATCHES_DIR = "cifar-10-batches-bin"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST_FILES = ["test_batch.bin"]
META_FILE = "batches.meta.txt"
RECORD_BYTES = 1 + 3 * 32 * 32
RECORDS_PER_FILE = 10_000

_BIN_NAME = re.compile(r"(^|/)(data_batch_[1-5]|test_batch)\.bin$")


def parse_batch(data: bytes, name: str, num_classes: int = len(CLASSES)) -> tuple[np.ndarray, np.ndarray]:
    """One ``*.bin`` file -> (uint8 images (N, 3, 32, 32), int64 labels (N,))."""
    if len(data) == 0 or len(data) % RECORD_BYTES:
        raise DataError(f"{name}: {len(data)} bytes is not a whole number of {RECORD_BYTES}-byte CIFAR-10 "
                        "records (truncated or not a CIFAR-10 binary batch)")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    if labels.max() >= num_classes:
        bad = int(np.argmax(labels >= num_classes))
        raise DataError(f"{name}: record {bad} has label {labels[bad]}, but there are only {num_classes} classes")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _bin_files_in(path: Path) -> dict[str, Path]:
    for root in (path, path / BATCHES_DIR):
        found = {p.name: p for p in root.glob("*.bin") if _BIN_NAME.search(p.name)}
        if found:
            if (root / META_FILE).is_file():
                found[META_FILE] = root / META_FILE
            return found
    return {}


def is_cifar10_binary(path: Path, container: str) -> bool:
    """True for a directory (``container`` "dir") holding the CIFAR-10 ``*.bin``
    batches, directly or in ``cifar-10-batches-bin/``, and for an archive ("tar",
    "zip") whose first members are them."""
    if container == "dir":
        return bool(_bin_files_in(path))
    if path.name == ARCHIVE_NAME:
        return True
    # Peek at the first few members only: a whole pass over an image-folder
    # archive would cost as much as reading it.
    try:
        for i, (name, _) in enumerate(iter_files(path, container)):
            if _BIN_NAME.search(name) or name.endswith(META_FILE):
                return True
            if i >= 8:
                break
    except DataError:
        return False
    return False


def read_cifar10_binary(source: Source) -> ImageDataset:
    """Parse canonical CIFAR-10 from a directory or an archive of the binary batches."""
    path = source.path
    if source.container == "dir":
        files = {name: p.read_bytes() for name, p in _bin_files_in(path).items()}
    else:
        files = {name.rsplit("/", 1)[-1]: data for name, data in iter_files(path, source.container)
                 if _BIN_NAME.search(name) or name.endswith(META_FILE)}
    missing = [f for f in TRAIN_FILES + TEST_FILES if f not in files]
    if missing:
        raise DataError(f"{path}: CIFAR-10 binary batches missing: {', '.join(missing)} "
                        f"(expected {', '.join(TRAIN_FILES + TEST_FILES)})")
    classes = CLASSES
    if META_FILE in files:
        classes = [line.strip() for line in files[META_FILE].decode("utf-8", "replace").splitlines() if line.strip()]
        if len(classes) != len(CLASSES):
            raise DataError(f"{path}: {META_FILE} names {len(classes)} classes, expected {len(CLASSES)}")

    def split(names: list[str]) -> Split:
        parts = [parse_batch(files[n], n, len(classes)) for n in names]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        return Split(torch.from_numpy(images), torch.from_numpy(labels))

    return ImageDataset(name="CIFAR-10", classes=classes, train=split(TRAIN_FILES), test=split(TEST_FILES),
                        source=str(path))


def download_cifar10(root: str | os.PathLike | None = None, url: str | None = None, md5: str | None = None) -> Path:
    """Download (once) and extract (once) the canonical archive into ``root``
    (default: the cache directory); return the directory holding the ``*.bin``
    batches. Offline this fails within seconds with a ``DataError`` saying how
    to point at a local copy. ``url`` and ``md5`` default to ``URL`` and ``MD5``."""
    root = Path(root) if root is not None else cache_dir()
    url, md5 = url or URL, md5 or MD5
    target = root / BATCHES_DIR
    if _complete(target):
        return target
    archive = download(url, root / ARCHIVE_NAME, md5)
    # Extract next to the target, then rename: a crash never leaves a partial batch dir.
    staging = root / f".extract-{os.getpid()}"
    safe_extract(archive, staging)
    extracted = staging / BATCHES_DIR
    if not extracted.is_dir():
        raise DataError(f"{archive} does not contain {BATCHES_DIR}/ (not the CIFAR-10 binary archive?)")
    try:
        if not _complete(target):  # else a concurrent run finished first
            shutil.rmtree(target, ignore_errors=True)  # an incomplete copy, e.g. a file deleted by hand
            os.rename(extracted, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _complete(batch_dir: Path) -> bool:
    return _bin_files_in(batch_dir).keys() >= set(TRAIN_FILES + TEST_FILES)
