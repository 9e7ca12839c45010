"""Decoding image records every epoch, in the worker pool of ``hasten.data.workers``.

``decode_stream`` hands chunks of record indices to the pool's worker processes,
which read the records (from a ``ByteRecords`` store, shared by fork, possibly
behind ``SlowStorage``: reads from several workers overlap like concurrent
requests), decode and optionally augment a whole chunk into one (k, H, W, 3)
uint8 array; the consumer receives the chunks in order. Decoding uses
``hasten.data.decode.decode_fitted``: simplejpeg when it is installed (about 7x
faster than Pillow on CIFAR-size JPEGs, measured 11 vs 80 microseconds), and
with ``image_size`` a JPEG is decoded at a reduced DCT scale before the resize
and crop.

Faults, as everywhere in hasten (``hasten.data.decode.check_bad_fraction``):
unreadable images are skipped and counted with their names, and the stream
stops with a ``DataError`` once more than ``max_bad_fraction`` of the records
seen (at least 100 counted) were bad. A worker process that dies makes the
iterator raise ``hasten.data.workers.DecodeWorkerError`` within about ``poll_s``
seconds instead of waiting forever for its chunk.

Changes the training math: no (decoding only; augmentation is the caller's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from hasten.data.decode import BadImageError, bad_reason, check_bad_fraction, decode_fitted
from hasten.data.workers import ordered_map
from hasten.errors import DataError

# Bad records counted before the fraction applies: one bad file among the first
# few of an epoch says nothing about the whole stream.
MIN_COUNTED = 100


@dataclass
class Chunk:
    """Decoded examples: images (k, H, W, 3) uint8, labels and keys (dataset indices) int64."""

    images: np.ndarray
    labels: np.ndarray
    keys: np.ndarray
    bad: list[tuple[str, str]] = field(default_factory=list)  # (name, reason) of skipped records


def decode_records(
    records: list[tuple[int, str, bytes, int]],
    image_size: int | None = None,
    augment: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> Chunk:
    """Decode (key, name, bytes, label) records into one ``Chunk``; bad files are listed, not raised."""
    arrays, labels, keys, bad = [], [], [], []
    for key, name, data, label in records:
        try:
            arrays.append(decode_fitted(data, name, image_size))
        except BadImageError as e:
            bad.append((name, bad_reason(e, name)))
            continue
        labels.append(label)
        keys.append(key)
    if arrays:
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise DataError(f"images differ in size ({sorted(shapes)[:3]}); pass --image-size S (image_size=S in "
                            "Python) to resize them")
        images = np.stack(arrays)
    else:
        images = np.zeros((0, 0, 0, 3), dtype=np.uint8)
    if augment is not None and len(arrays):
        images = augment(images, np.asarray(keys, dtype=np.int64))
    return Chunk(images, np.asarray(labels, dtype=np.int64), np.asarray(keys, dtype=np.int64), bad)


def read_records(records, indices: np.ndarray) -> list[tuple[int, str, bytes, int]]:
    """(key, name, bytes, label) for each index, read from ``records[i] -> (name, bytes, label)``."""
    out = []
    for i in indices.tolist():
        name, data, label = records[i]
        out.append((i, name, data, label))
    return out


def _read_and_decode(records, indices: np.ndarray, *, image_size, augment) -> Chunk:
    return decode_records(read_records(records, indices), image_size, augment)


def decode_stream(
    records,
    chunks: Iterable[np.ndarray],
    *,
    workers: int = 0,
    image_size: int | None = None,
    augment: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    prefetch: int = 4,
    max_bad_fraction: float = 0.01,
    mp_context: str | None = None,
    poll_s: float = 0.2,
    on_bad: Callable[[list[tuple[str, str]]], None] | None = None,
) -> Iterator[Chunk]:
    """Decoded ``Chunk`` s for each array of indices in ``chunks``, in order.

    ``records[i]`` must return (name, bytes, label). ``workers=0`` decodes in a
    thread (no processes: for DataLoader workers and small jobs). ``prefetch``:
    chunks read ahead of the consumer. ``augment(images, keys)`` runs on each
    decoded chunk in the worker (keys: the dataset indices of the images).
    ``on_bad`` receives the (name, reason) of each chunk's bad records.
    """
    if not 0 <= max_bad_fraction <= 1:
        raise ValueError(f"max_bad_fraction must be in [0, 1]; got {max_bad_fraction!r}")
    decoded = ordered_map(partial(_read_and_decode, records, image_size=image_size, augment=augment),
                          (np.asarray(c) for c in chunks), workers=workers, prefetch=prefetch, poll_s=poll_s,
                          mp_context=mp_context)
    return _count_bad(decoded, max_bad_fraction, on_bad)


def _count_bad(chunks: Iterator[Chunk], max_bad_fraction: float, on_bad) -> Iterator[Chunk]:
    seen, skipped = 0, []
    try:
        for chunk in chunks:
            seen += len(chunk.keys) + len(chunk.bad)
            if chunk.bad:
                skipped.extend(chunk.bad)
                if on_bad is not None:
                    on_bad(chunk.bad)
                check_bad_fraction(skipped, seen, max_bad_fraction, min_total=MIN_COUNTED)
            yield chunk
    finally:
        chunks.close()  # stops the workers now, not when the pool is garbage
