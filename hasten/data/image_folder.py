"""Image-folder datasets (``train/<class>/*``, ``test/<class>/*``), decoded once.

The layout is torchvision's ``ImageFolder`` (``hasten.data.layout``: one folder
per class, labels in the order of the sorted class names), read from a directory
or an archive (.tar, .tar.gz, .tar.xz, .zip). JPEG and PNG files are decoded
once, in the worker processes of ``hasten.data.workers`` while the archive is
still being read, into uint8 tensors that are cached on disk under
``hasten.data.cache.cache_key``: the input's content and the one option that
changes the pixels, ``image_size``. A second run hashes the input and
``np.load``s the arrays instead of reading and decoding again
(``benchmarks/data_load.py`` measures both).

Bad input policy (``hasten.data.bad_files.check_bad_fraction``): files that are not
readable JPEG/PNG images (truncated, corrupt, another format) are skipped,
logged and listed in ``.skipped`` while they are at most ``max_bad_fraction`` of
the files (default 1%); above it the load stops with one ``DataError`` naming
them. Layout errors (``hasten.data.layout``), unreadable or malicious archives,
a class left without a readable image, and images of different sizes without
``image_size`` each stop the load with one ``DataError``. Dot-files
(``.DS_Store``) are ignored.
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from hasten.cores import usable_cores
from hasten.data.archive import iter_entries
from hasten.data.bad_files import bad_reason, check_bad_fraction, describe_skipped
from hasten.data.cache import entry_dir, load_entry, save_entry
from hasten.data.cifar10 import CLASSES as CIFAR10_CLASSES
from hasten.data.dataset import ImageDataset, Source, Split
from hasten.data.layout import SPLITS, parse_layout
from hasten.data.workers import DecodeWorkerError, ordered_map
from hasten.decode.header import image_format
from hasten.decode.image import decode_image
from hasten.errors import BadImageError, DataError
from hasten.progress import progress

log = logging.getLogger("hasten.data")

# Bump when the decoded output for the same input and options changes.
CACHE_VERSION = 1
CHUNK = 256  # images per worker task: large enough to amortise pickling, small enough to balance
_ARRAYS = ["train_images", "train_labels", "test_images", "test_labels"]


def check_options(*, image_size: int | None, max_bad_fraction: float, workers: int | None) -> None:
    """``DataError`` for an option ``load_image_folder`` cannot use."""
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise DataError(f"image_size must be a positive int or None, got {image_size!r}")
    if not 0.0 <= max_bad_fraction < 1.0:
        raise DataError(f"max_bad_fraction must be in [0, 1), got {max_bad_fraction!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise DataError(f"workers must be a positive int or None (all cores), got {workers!r}")


def load_image_folder(
    source: Source,
    *,
    image_size: int | None = None,
    max_bad_fraction: float = 0.01,
    workers: int | None = None,
    cache: bool = True,
) -> ImageDataset:
    """Read an image-folder dataset (see the module docstring); ``source`` from
    ``hasten.data.sources.resolve_source``."""
    check_options(image_size=image_size, max_bad_fraction=max_bad_fraction, workers=workers)
    where = str(source.path)
    # Only what changes the decoded pixels goes into the key: workers and the
    # threshold do not, so a run with other values still hits the entry.
    entry = entry_dir("image_folder", source, {"version": CACHE_VERSION, "image_size": image_size}) if cache else None
    if entry is not None:
        hit = load_entry(entry, _ARRAYS)
        if hit is not None:
            arrays, meta = hit
            skipped = [tuple(s) for s in meta["skipped"]]
            check_bad_fraction(skipped, meta["total_files"], max_bad_fraction, where)
            return _dataset(meta["name"], meta["classes"], arrays, where, skipped, cached=True)

    names, dirs, formats, chunks = _read_and_decode(source, image_size, workers or usable_cores())
    layout = parse_layout(names, dirs, source=where)
    reasons = [reason for chunk in chunks for reason in chunk.reasons]
    shapes = [shape for chunk in chunks for shape in chunk.shapes]

    samples = [(i, split, label) for split in SPLITS
               for i, label in zip(layout.splits[split].indices, layout.splits[split].labels)]
    skipped = layout.stray + [(names[i], reasons[i]) for i, _, _ in samples if reasons[i] is not None]
    total = len(samples) + len(layout.stray)
    check_bad_fraction(skipped, total, max_bad_fraction, where)
    good = [(i, split, label) for i, split, label in samples if reasons[i] is None]
    _check_sizes(where, [(names[i], shapes[i]) for i, _, _ in good])

    arrays = {}
    for split in SPLITS:
        mine = [(i, label) for i, s, label in good if s == split]
        lost = sorted(set(layout.classes) - {layout.classes[label] for _, label in mine})
        if lost:
            raise DataError(f"{where}: no readable image left in {split}/ for class(es) {', '.join(lost)}")
        arrays[f"{split}_images"] = _assemble(chunks, [i for i, _ in mine])
        arrays[f"{split}_labels"] = np.array([label for _, label in mine], dtype=np.int64)

    all_jpeg = all(formats[i] == "jpeg" for i, _, _ in good)
    name = "CIFAR-10-JPEG" if layout.classes == CIFAR10_CLASSES and all_jpeg else source.name
    if entry is not None:
        try:
            save_entry(entry, arrays, {"name": name, "classes": layout.classes, "skipped": skipped,
                                       "total_files": total, "source": where, "version": CACHE_VERSION})
        except OSError as e:
            log.warning("could not write the decode cache %s (%s); the next run decodes again", entry, e)
    return _dataset(name, layout.classes, arrays, where, skipped, cached=False)


def _dataset(name, classes, arrays, source, skipped, cached) -> ImageDataset:
    if skipped:
        log.warning("%s: skipped %d unreadable file(s): %s", source, len(skipped), describe_skipped(skipped))
    splits = {s: Split(torch.from_numpy(arrays[f"{s}_images"]), torch.from_numpy(arrays[f"{s}_labels"]))
              for s in SPLITS}
    return ImageDataset(name=name, classes=list(classes), train=splits["train"], test=splits["test"],
                        source=source, skipped=list(skipped), cached=cached)


class DecodedChunk(NamedTuple):
    """What a worker sends back for ``CHUNK`` consecutive files."""

    images: np.ndarray | list[np.ndarray]  # good images: (k, 3, H, W) if one size, else k (3, H, W) arrays
    reasons: list[str | None]  # per file: why it is bad, or None
    shapes: list[tuple[int, int] | None]  # per file: (H, W) when good


def _read_and_decode(
    source: Source, image_size: int | None, workers: int
) -> tuple[list[str], list[str], list[str | None], list[DecodedChunk]]:
    """One pass over the input: file names, directory names, each file's format,
    and the decoded chunks of ``CHUNK`` consecutive files.

    The pool's feeder thread reads the archive and hands chunks to the worker
    processes as they fill, so decompression (one core) overlaps decoding (the
    others). Every file except dot-files is decoded; which ones are samples is
    decided afterwards, from the names.
    """
    names, dirs, formats = [], [], []

    def chunks():
        batch = []
        with progress(desc="reading and decoding", unit="file") as bar:
            for name, data in iter_entries(source.path, source.container):
                if data is None:
                    dirs.append(name)
                    continue
                if name.rsplit("/", 1)[-1].startswith("."):
                    continue
                names.append(name)
                formats.append(image_format(data))
                batch.append((name, data))
                if len(batch) == CHUNK:
                    yield batch
                    batch = []
                bar.update()
            if batch:
                yield batch

    try:
        # workers=1: decode in this process (the pool's thread), which also shows where a decoder crashes.
        decoded = list(ordered_map(partial(_decode_chunk, image_size=image_size), chunks(),
                                   workers=workers if workers > 1 else 0, prefetch=2 * workers))
    except DecodeWorkerError as e:
        raise DataError(f"{source.path}: {e} (workers=1)") from None
    return names, dirs, formats, decoded


def _decode_chunk(chunk: list[tuple[str, bytes]], image_size: int | None) -> DecodedChunk:
    """Decode in a worker; good images of one size travel back as one array (one cheap pickle)."""
    arrays, reasons, shapes = [], [], []
    for name, data in chunk:
        try:
            array = decode_image(data, name, image_size)
        except BadImageError as e:
            reasons.append(bad_reason(e, name))
            shapes.append(None)
            continue
        arrays.append(array)
        reasons.append(None)
        shapes.append(array.shape[:2])
    if arrays and len({a.shape for a in arrays}) == 1:
        return DecodedChunk(np.stack(arrays).transpose(0, 3, 1, 2).copy(), reasons, shapes)
    return DecodedChunk([a.transpose(2, 0, 1).copy() for a in arrays], reasons, shapes)


def _assemble(chunks: list[DecodedChunk], files: list[int]) -> np.ndarray:
    """Gather the decoded images of ``files`` (indices in reading order) into one
    (N, 3, H, W) array; callers checked that they are good and of one size."""
    rows_of = [np.cumsum([r is None for r in chunk.reasons]) - 1 for chunk in chunks]
    by_chunk: dict[int, tuple[list[int], list[int]]] = {}
    for pos, i in enumerate(files):
        c, j = divmod(i, CHUNK)
        dst, src = by_chunk.setdefault(c, ([], []))
        dst.append(pos)
        src.append(int(rows_of[c][j]))
    first = files[0]
    h, w = chunks[first // CHUNK].shapes[first % CHUNK]
    out = np.empty((len(files), 3, h, w), dtype=np.uint8)
    for c, (dst, src) in by_chunk.items():
        images = chunks[c].images
        if isinstance(images, np.ndarray):
            out[dst] = images[src]
        else:
            for d, s in zip(dst, src):
                out[d] = images[s]
    return out


def _check_sizes(where: str, named_shapes: list[tuple[str, tuple[int, int]]]) -> None:
    counts = Counter(shape for _, shape in named_shapes)
    if len(counts) <= 1:
        return
    (h, w), _ = counts.most_common(1)[0]
    odd = [(n, shape) for n, shape in named_shapes if shape != (h, w)]
    name, (oh, ow) = odd[0]
    raise DataError(
        f"{where}: images have different sizes: most are {h}x{w}, but {name} is {oh}x{ow}"
        f"{f' (and {len(odd) - 1} more)' if len(odd) > 1 else ''}; pass --image-size S (image_size=S in Python) "
        "to resize the shorter side to S and center-crop SxS"
    )
