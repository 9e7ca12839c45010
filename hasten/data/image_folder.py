"""Image-folder datasets (``train/<class>/*``, ``test/<class>/*``), decoded once.

The layout of torchvision's ``ImageFolder``, one folder per class and the label
order given by the sorted class names, read from a directory or an archive
(.tar, .tar.gz, .tar.xz, .zip; the layout may sit under one top-level folder).
JPEG and PNG files are decoded once, in parallel worker processes, into uint8
tensors that are cached on disk under a key derived from the input's content
(sha256 of the archive bytes; for a directory, its file names, sizes and
modification times) and the options that change the pixels. A second run hashes
the input and ``np.load``s the arrays instead of reading and decoding again
(``benchmarks/data_load.py`` measures both).

Bad input policy: files that are not readable JPEG/PNG images (truncated,
corrupt, another format) are skipped, logged and listed in ``.skipped`` while
they are at most ``max_bad_fraction`` of the files (default 1%); above it the
load stops with one ``DataError`` naming them. Missing ``train/`` or ``test/``,
empty class folders, train and test with different classes, unreadable or
malicious archives, and images of different sizes without ``image_size`` each
stop the load with one ``DataError``. Dot-files (``.DS_Store``) are ignored.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from hasten.data.dataset import ImageDataset, Split
from hasten.data.archive import archive_kind, archive_stem, iter_entries
from hasten.data.cache import cache_dir, entry_key, file_sha256, load_entry, save_entry, tree_fingerprint
from hasten.data.cifar10 import CLASSES as CIFAR10_CLASSES
from hasten.data.decode import BadImageError, decode_image, image_format
from hasten.errors import DataError
from hasten.progress import progress

log = logging.getLogger("hasten.data")

# Bump when the decoded output for the same input and options changes.
CACHE_VERSION = 1
SPLITS = ("train", "test")
CHUNK = 256  # images per worker task: large enough to amortise pickling, small enough to balance
_ARRAYS = ["train_images", "train_labels", "test_images", "test_labels"]
_SHOW = 10  # file names listed in one error message


def load_image_folder(
    path: str | os.PathLike,
    *,
    image_size: int | None = None,
    max_bad_fraction: float = 0.01,
    workers: int | None = None,
    cache: bool = True,
) -> ImageDataset:
    """Read an image-folder dataset from a directory or an archive (see the module docstring)."""
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise DataError(f"image_size must be a positive int or None, got {image_size!r}")
    if not 0.0 <= max_bad_fraction < 1.0:
        raise DataError(f"max_bad_fraction must be in [0, 1), got {max_bad_fraction!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise DataError(f"workers must be a positive int or None (all cores), got {workers!r}")
    path = Path(path)
    kind = archive_kind(path)
    if kind is None:
        raise DataError(f"{str(path)!r} is not a directory or a supported archive "
                        "(.tar, .tar.gz, .tar.xz, .tar.bz2, .zip)")
    stem = path.resolve().name if kind == "dir" else archive_stem(path)

    entry = None
    if cache:
        fingerprint = tree_fingerprint(path) if kind == "dir" else file_sha256(path)
        key = entry_key(fingerprint, {"version": CACHE_VERSION, "image_size": image_size})
        entry = cache_dir() / "image_folder" / f"{stem}-{key}"
        hit = load_entry(entry, _ARRAYS)
        if hit is not None:
            arrays, meta = hit
            skipped = [tuple(s) for s in meta["skipped"]]
            _check_bad_fraction(path, skipped, meta["total_files"], max_bad_fraction)
            return _dataset(meta["name"], meta["classes"], arrays, str(path), skipped, cached=True)

    names, dirs, formats, chunks = _read_and_decode(path, image_size, workers or usable_cores())
    classes, samples, stray = _layout(path, names, dirs)
    reasons = [reason for chunk in chunks for reason in chunk.reasons]
    shapes = [shape for chunk in chunks for shape in chunk.shapes]

    skipped = stray + [(names[i], reasons[i]) for i, _, _ in samples if reasons[i] is not None]
    total = len(samples) + len(stray)
    _check_bad_fraction(path, skipped, total, max_bad_fraction)
    good = [(i, split, label) for i, split, label in samples if reasons[i] is None]
    _check_sizes(path, [(names[i], shapes[i]) for i, _, _ in good])

    arrays = {}
    for split in SPLITS:
        mine = [(i, label) for i, s, label in good if s == split]
        lost = sorted(set(classes) - {classes[label] for _, label in mine})
        if lost:
            raise DataError(f"{path}: no readable image left in {split}/ for class(es) {', '.join(lost)}")
        arrays[f"{split}_images"] = _assemble(chunks, [i for i, _ in mine])
        arrays[f"{split}_labels"] = np.array([label for _, label in mine], dtype=np.int64)

    all_jpeg = all(formats[i] == "jpeg" for i, _, _ in good)
    name = "CIFAR-10-JPEG" if classes == CIFAR10_CLASSES and all_jpeg else stem
    if entry is not None:
        try:
            save_entry(entry, arrays, {"name": name, "classes": classes, "skipped": skipped,
                                       "total_files": total, "source": str(path), "version": CACHE_VERSION})
        except OSError as e:
            log.warning("could not write the decode cache %s (%s); the next run decodes again", entry, e)
    return _dataset(name, classes, arrays, str(path), skipped, cached=False)


def _dataset(name, classes, arrays, source, skipped, cached) -> ImageDataset:
    if skipped:
        shown = ", ".join(f"{n} ({r})" for n, r in skipped[:_SHOW])
        more = f" and {len(skipped) - _SHOW} more" if len(skipped) > _SHOW else ""
        log.warning("%s: skipped %d unreadable file(s): %s%s", source, len(skipped), shown, more)
    splits = {s: Split(torch.from_numpy(arrays[f"{s}_images"]), torch.from_numpy(arrays[f"{s}_labels"]))
              for s in SPLITS}
    return ImageDataset(name=name, classes=list(classes), train=splits["train"], test=splits["test"],
                        source=source, skipped=list(skipped), cached=cached)


class DecodedChunk(NamedTuple):
    """What a worker sends back for ``CHUNK`` consecutive files."""

    images: np.ndarray | list[np.ndarray]  # good images: (k, 3, H, W) if one size, else k (3, H, W) arrays
    reasons: list[str | None]  # per file: why it is bad, or None
    shapes: list[tuple[int, int] | None]  # per file: (H, W) when good


def usable_cores() -> int:
    """Cores this process may run on (a container's limit, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _pool(workers: int) -> ProcessPoolExecutor:
    # fork where it is safe (Linux): workers start in milliseconds and never
    # re-import the caller's script, whatever the Python version's default.
    methods = mp.get_all_start_methods()
    context = mp.get_context("fork") if "fork" in methods and sys.platform == "linux" else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=context)


def _read_and_decode(
    path: Path, image_size: int | None, workers: int
) -> tuple[list[str], list[str], list[str | None], list[DecodedChunk]]:
    """One pass over the input: file names, directory names, each file's format,
    and the decoded chunks of ``CHUNK`` consecutive files.

    Chunks go to the worker processes while the archive is still being read, so
    decompression (one core) overlaps decoding (the others). Every file except
    dot-files is decoded; which ones are samples is decided afterwards.
    """
    names, dirs, formats, pending, batch = [], [], [], [], []
    pool = _pool(workers) if workers > 1 else None

    def submit():
        pending.append(pool.submit(_decode_chunk, batch, image_size) if pool else _decode_chunk(batch, image_size))

    try:
        with progress(desc="reading and decoding", unit="file") as bar:
            for name, data in iter_entries(path):
                if data is None:
                    dirs.append(name)
                    continue
                if name.rsplit("/", 1)[-1].startswith("."):
                    continue
                names.append(name)
                formats.append(image_format(data))
                batch.append((name, data))
                if len(batch) == CHUNK:
                    submit()
                    batch = []
                bar.update()
            if batch:
                submit()
            chunks = [p.result() if pool else p for p in pending]
    except BrokenProcessPool:
        raise DataError(f"{path}: a decoding worker process died (out of memory, or a crash inside the image "
                        "decoder); workers=1 decodes in this process and shows where") from None
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    return names, dirs, formats, chunks


def _decode_chunk(chunk: list[tuple[str, bytes]], image_size: int | None) -> DecodedChunk:
    """Decode in a worker; good images of one size travel back as one array (one cheap pickle)."""
    arrays, reasons, shapes = [], [], []
    for name, data in chunk:
        try:
            array = decode_image(data, name, image_size)
        except BadImageError as e:
            reasons.append(str(e).removeprefix(f"{name}: "))
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


def _layout(path: Path, names: list[str], dirs: list[str]):
    """Check the folder layout from names alone. Returns the sorted class names,
    the samples as (file index, split, label) in (split, class, name) order, and
    stray files that sit in a split folder but outside any class folder."""
    root = _find_root(path, names + dirs)
    found: dict[str, dict[str, list[tuple[str, int]]]] = {s: {} for s in SPLITS}
    stray = []
    entries = [(n, None) for n in dirs] + [(n, i) for i, n in enumerate(names)]
    for name, index in entries:
        parts = name[len(root):].split("/") if name.startswith(root) else []
        if len(parts) < 2 or parts[0] not in SPLITS or parts[-1].startswith("."):
            continue
        if len(parts) == 2:
            if index is None:
                found[parts[0]].setdefault(parts[1], [])
            else:
                stray.append((name, f"not inside a {parts[0]}/<class>/ folder"))
            continue
        files = found[parts[0]].setdefault(parts[1], [])
        if index is not None:
            files.append((name, index))

    train, test = set(found["train"]), set(found["test"])
    if train != test:
        raise DataError(
            f"{path}: train/ and test/ have different classes: only in train: {sorted(train - test) or 'none'}; "
            f"only in test: {sorted(test - train) or 'none'}"
        )
    empty = [f"{root}{s}/{c}" for s in SPLITS for c in sorted(found[s]) if not found[s][c]]
    if empty:
        raise DataError(f"{path}: empty class folder(s): {', '.join(empty)}")
    classes = sorted(train)
    samples = [(i, s, label) for s in SPLITS for label, c in enumerate(classes) for _, i in sorted(found[s][c])]
    return classes, samples, stray


def _find_root(path: Path, names: list[str]) -> str:
    """The prefix ("" or "<folder>/") under which train/<class>/ and test/<class>/ live."""
    roots = set()
    for name in names:
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if part in SPLITS:
                roots.add("/".join(parts[:i]))
                break
    for root in sorted(roots, key=lambda r: (r.count("/") if r else -1, r)):
        prefix = root + "/" if root else ""
        if all(any(n.startswith(f"{prefix}{s}/") for n in names) for s in SPLITS):
            return prefix
    top = sorted({n.split("/")[0] for n in names})
    hint = ""
    if any(n.rsplit("/", 1)[-1] == "data_batch_1" for n in names):
        hint = ("; this looks like the pickled 'python version' of CIFAR-10, which is never unpickled "
                "here (it can run code): use the binary version, cifar-10-binary.tar.gz")
    raise DataError(
        f"{path}: expected folders train/<class>/ and test/<class>/, found "
        f"{', '.join(top[:_SHOW]) or 'nothing'}{' ...' if len(top) > _SHOW else ''}{hint}"
    )


def _check_bad_fraction(path: Path, skipped: list[tuple[str, str]], total: int, limit: float) -> None:
    if len(skipped) > limit * total:
        shown = "; ".join(f"{n} ({r})" for n, r in skipped[:_SHOW])
        more = f"; and {len(skipped) - _SHOW} more" if len(skipped) > _SHOW else ""
        raise DataError(
            f"{path}: {len(skipped)} of {total} files ({len(skipped) / max(total, 1):.1%}) are not readable "
            f"images, more than max_bad_fraction={limit:g}: {shown}{more}"
        )


def _check_sizes(path: Path, named_shapes: list[tuple[str, tuple[int, int]]]) -> None:
    counts = Counter(shape for _, shape in named_shapes)
    if len(counts) <= 1:
        return
    (h, w), _ = counts.most_common(1)[0]
    odd = [(n, shape) for n, shape in named_shapes if shape != (h, w)]
    name, (oh, ow) = odd[0]
    raise DataError(
        f"{path}: images have different sizes: most are {h}x{w}, but {name} is {oh}x{ow}"
        f"{f' (and {len(odd) - 1} more)' if len(odd) > 1 else ''}; pass image_size=S to resize the "
        "shorter side to S and center-crop SxS"
    )
