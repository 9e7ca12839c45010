"""Image-folder datasets (``train/<class>/*``, ``test/<class>/*``), decoded once.

The layout of torchvision's ``ImageFolder``, one folder per class and the label
order given by the sorted class names, read from a directory or an archive
(.tar, .tar.gz, .tar.xz, .zip; the layout may sit under one top-level folder).
JPEG and PNG files are decoded once, in parallel worker processes, into uint8
tensors that are cached on disk under a key derived from the input's content
(sha256 of the archive bytes; for a directory, its file names, sizes and
modification times) and the options that change the pixels. A second run loads
the cache with ``np.load`` in about a second instead of decoding again.

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
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from hasten.data import ImageDataset, Split
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

    classes, samples, stray = _collect(path)
    names = [n for n, _, _ in samples]
    results = _decode_all([(n, d) for n, d, _ in samples], image_size, workers or os.cpu_count() or 1)

    skipped = stray + [(n, r) for n, r in zip(names, results) if isinstance(r, str)]
    total = len(samples) + len(stray)
    _check_bad_fraction(path, skipped, total, max_bad_fraction)
    good = [(n, r, label) for (n, _, label), r in zip(samples, results) if not isinstance(r, str)]
    _check_sizes(path, good)

    arrays = {}
    for split in SPLITS:
        mine = [(n, img, label) for n, img, label in good if n.startswith(split + "/")]
        present = {label for _, _, label in mine}
        lost = [c for i, c in enumerate(classes) if i not in present]
        if lost:
            raise DataError(f"{path}: no readable image left in {split}/ for class(es) {', '.join(lost)}")
        arrays[f"{split}_images"] = np.stack([img for _, img, _ in mine]).transpose(0, 3, 1, 2).copy()
        arrays[f"{split}_labels"] = np.array([label for _, _, label in mine], dtype=np.int64)

    all_jpeg = all(image_format(d) == "jpeg" for (_, d, _), r in zip(samples, results) if not isinstance(r, str))
    name = "CIFAR-10-JPEG" if classes == CIFAR10_CLASSES and all_jpeg else stem
    if entry is not None:
        save_entry(entry, arrays, {"name": name, "classes": classes, "skipped": skipped,
                                   "total_files": total, "source": str(path), "version": CACHE_VERSION})
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


def _collect(path: Path) -> tuple[list[str], list[tuple[str, bytes, int]], list[tuple[str, str]]]:
    """Read the tree once: sorted class names, (name, bytes, label) samples in
    (split, class, name) order, and stray files that sit in a split folder but
    outside any class folder."""
    entries = list(iter_entries(path))
    root = _find_root(path, entries)
    found: dict[str, dict[str, list[tuple[str, bytes]]]] = {s: {} for s in SPLITS}
    stray = []
    for name, data in entries:
        parts = name[len(root):].split("/") if name.startswith(root) else []
        if len(parts) < 2 or parts[0] not in SPLITS or parts[-1].startswith("."):
            continue
        rel = "/".join(parts)
        if len(parts) == 2:
            if data is None:
                found[parts[0]].setdefault(parts[1], [])
            else:
                stray.append((rel, f"not inside a {parts[0]}/<class>/ folder"))
            continue
        files = found[parts[0]].setdefault(parts[1], [])
        if data is not None:
            files.append((rel, data))

    train, test = set(found["train"]), set(found["test"])
    if train != test:
        raise DataError(
            f"{path}: train/ and test/ have different classes: only in train: {sorted(train - test) or 'none'}; "
            f"only in test: {sorted(test - train) or 'none'}"
        )
    empty = [f"{s}/{c}" for s in SPLITS for c in sorted(found[s]) if not found[s][c]]
    if empty:
        raise DataError(f"{path}: empty class folder(s): {', '.join(empty)}")
    classes = sorted(train)
    samples = [(n, d, label) for s in SPLITS for label, c in enumerate(classes) for n, d in sorted(found[s][c])]
    return classes, samples, stray


def _find_root(path: Path, entries: list[tuple[str, bytes | None]]) -> str:
    """The prefix ("" or "<folder>/") under which train/<class>/ and test/<class>/ live."""
    roots = set()
    for name, _ in entries:
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if part in SPLITS:
                roots.add("/".join(parts[:i]))
                break
    for root in sorted(roots, key=lambda r: (r.count("/") if r else -1, r)):
        prefix = root + "/" if root else ""
        if all(any(n.startswith(f"{prefix}{s}/") for n, _ in entries) for s in SPLITS):
            return prefix
    top = sorted({n.split("/")[0] for n, _ in entries})
    raise DataError(
        f"{path}: expected folders train/<class>/ and test/<class>/, found "
        f"{', '.join(top[:_SHOW]) or 'nothing'}{' ...' if len(top) > _SHOW else ''}"
    )


def _decode_chunk(chunk: list[tuple[str, bytes]], image_size: int | None) -> list[np.ndarray | str]:
    """Decode in a worker: an array per good file, the reason (a str) per bad one."""
    out = []
    for name, data in chunk:
        try:
            out.append(decode_image(data, name, image_size))
        except BadImageError as e:
            out.append(str(e).split(": ", 1)[-1])
    return out


def _decode_all(files: list[tuple[str, bytes]], image_size: int | None, workers: int) -> list[np.ndarray | str]:
    chunks = [files[i : i + CHUNK] for i in range(0, len(files), CHUNK)]
    bar = progress(total=len(files), desc="decoding images", unit="img")
    results: list[np.ndarray | str] = []
    with bar:
        if workers == 1 or len(chunks) == 1:
            for chunk in chunks:
                results.extend(_decode_chunk(chunk, image_size))
                bar.update(len(chunk))
        else:
            with ProcessPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
                for chunk, out in zip(chunks, pool.map(_decode_chunk, chunks, [image_size] * len(chunks))):
                    results.extend(out)
                    bar.update(len(chunk))
    return results


def _check_bad_fraction(path: Path, skipped: list[tuple[str, str]], total: int, limit: float) -> None:
    if len(skipped) > limit * total:
        shown = "; ".join(f"{n} ({r})" for n, r in skipped[:_SHOW])
        more = f"; and {len(skipped) - _SHOW} more" if len(skipped) > _SHOW else ""
        raise DataError(
            f"{path}: {len(skipped)} of {total} files ({len(skipped) / max(total, 1):.1%}) are not readable "
            f"images, more than max_bad_fraction={limit:g}: {shown}{more}"
        )


def _check_sizes(path: Path, good: list[tuple[str, np.ndarray, int]]) -> None:
    shapes = Counter(img.shape for _, img, _ in good)
    if len(shapes) <= 1:
        return
    (h, w, _), _ = shapes.most_common(1)[0]
    odd = [(n, img.shape) for n, img, _ in good if img.shape[:2] != (h, w)]
    name, (oh, ow, _) = odd[0]
    raise DataError(
        f"{path}: images have different sizes: most are {h}x{w}, but {name} is {oh}x{ow}"
        f"{f' (and {len(odd) - 1} more)' if len(odd) > 1 else ''}; pass image_size=S to resize the "
        "shorter side to S and center-crop SxS"
    )
