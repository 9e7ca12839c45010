"""Decoding a list of image records into one array, bad files listed by name.

``decode_records`` decodes (key, name, bytes, label) records into one (k, H, W, 3)
uint8 ``Chunk``, for whoever decodes a set once (the echo recipes' in-memory data);
``read_records`` reads them from ``records[i] -> (name, bytes, label)``. Decoding uses
``hasten.decode.image.decode_fitted``: simplejpeg when it is installed (about 7x
faster than Pillow on CIFAR-size JPEGs, measured 11 vs 80 microseconds), and
with ``image_size`` a JPEG is decoded at a reduced DCT scale before the resize
and crop. The streaming pipeline decodes in ``hasten.stream.chunk_decode`` (its
workers) and shares ``MIN_COUNTED`` from here.

Faults, as everywhere in hasten (``hasten.data.bad_files.check_bad_fraction``):
unreadable images are listed with their names, not raised; a stream stops with a
``DataError`` once more than ``max_bad_fraction`` of the records seen (at least
``MIN_COUNTED``) were bad.

Changes the training math: no (decoding only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hasten.data.bad_files import bad_reason
from hasten.decode.image import decode_fitted
from hasten.errors import BadImageError
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


def decode_records(records: list[tuple[int, str, bytes, int]], image_size: int | None = None) -> Chunk:
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
    return Chunk(images, np.asarray(labels, dtype=np.int64), np.asarray(keys, dtype=np.int64), bad)


def read_records(records, indices: np.ndarray) -> list[tuple[int, str, bytes, int]]:
    """(key, name, bytes, label) for each index, read from ``records[i] -> (name, bytes, label)``."""
    out = []
    for i in indices.tolist():
        name, data, label = records[i]
        out.append((i, name, data, label))
    return out
