"""Raw-bytes record store: an image folder or archive read once, then random access.

A .tar.xz (or .tar.gz) archive can only be read front to back, which rules out
shuffled reading and each rank reading its own examples. ``open_records`` therefore makes one
sequential pass over the folder or archive and writes each split as a single
blob of the undecoded file bytes plus offsets, labels and names into the cache
(``$HASTEN_CACHE/records/``, under ``hasten.data.cache.cache_key`` of the
input). Later runs memory-map the blob: reading record i is a slice, and
worker processes forked from the reader share the same pages. The bytes stay
compressed (JPEG), so the cache is about the size of the image payload (55 MB
for CIFAR-10-JPEG), and decoding remains the streaming pipeline's job.

Files and labels come from ``hasten.data.layout``, as for ``load_dataset``: record
i of a split is image i of the same split of the decoded dataset when no file is bad.

Changes the training math: no.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from hasten.data.archive import iter_entries
from hasten.data.cache import entry_dir, load_entry, save_entry
from hasten.data.dataset import Source
from hasten.data.bad_files import describe_skipped
from hasten.data.layout import SPLITS, parse_layout
from hasten.data.sources import resolve_source
from hasten.errors import DataError
from hasten.progress import progress, status

log = logging.getLogger("hasten.stream")

_FORMAT = 2  # bump when the stored records for the same input change (2: labels from hasten.data.layout)


@dataclass
class ByteRecords:
    """One split: ``records[i]`` is (name, file bytes, label)."""

    names: list[str]
    labels: np.ndarray  # int64 (N,)
    offsets: np.ndarray  # int64 (N + 1,): bytes of record i are blob[offsets[i]:offsets[i + 1]]
    blob: np.ndarray  # uint8, usually memory-mapped
    classes: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> tuple[str, bytes, int]:
        i = int(i)
        return self.names[i], self.blob[self.offsets[i] : self.offsets[i + 1]].tobytes(), int(self.labels[i])

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])


def _build(source: Source) -> tuple[dict[str, np.ndarray], dict]:
    names, dirs, blobs = [], [], []
    status(f"reading {source.path.name} once into the record cache (later runs map it)")
    with progress(desc=f"reading {source.path.name}", unit="file") as bar:
        for name, data in iter_entries(source.path, source.container):
            if data is None:
                dirs.append(name)
            else:
                names.append(name)
                blobs.append(data)
                bar.update()
    layout = parse_layout(names, dirs, source=str(source.path))
    if layout.stray:
        log.warning("%s: %d file(s) outside any class folder left out: %s", source.path, len(layout.stray),
                    describe_skipped(layout.stray))
    arrays, meta = {}, {"format": _FORMAT, "classes": layout.classes, "source": str(source.path), "names": {}}
    for split in SPLITS:
        files = layout.splits[split]
        sizes = np.array([len(blobs[i]) for i in files.indices], dtype=np.int64)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arrays[f"{split}_labels"] = np.array(files.labels, dtype=np.int64)
        arrays[f"{split}_blob"] = np.frombuffer(b"".join(blobs[i] for i in files.indices), dtype=np.uint8)
        meta["names"][split] = [names[i] for i in files.indices]
    return arrays, meta


def open_records(source: Source | str | os.PathLike, split: str = "train", *,
                 cache: str | os.PathLike | None = None) -> ByteRecords:
    """The ``split`` ("train" or "test") of an image folder or archive as ``ByteRecords``.

    ``source``: a ``Source`` already resolved (``hasten.data.sources.resolve_source``),
    or a path, resolved here. The first call reads the whole input once and caches both
    splits; later calls map the cache. ``cache`` overrides the cache root (default
    ``$HASTEN_CACHE``).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {', '.join(SPLITS)}")
    if not isinstance(source, Source):
        source = resolve_source(source)
    if source.kind != "image-folder":
        raise DataError(f"{str(source.path)!r} is CIFAR-10 in its binary format, not image files; the streaming "
                        "pipeline reads image folders (train/<class>/<file>): use load_dataset for this one")
    entry = entry_dir("records", source, {"format": _FORMAT}, root=cache)
    names = [f"{split}_labels", f"{split}_offsets", f"{split}_blob"]
    hit = load_entry(entry, names, mmap=True)
    if hit is None:  # not built yet, or damaged and just deleted
        save_entry(entry, *_build(source))
        hit = load_entry(entry, names, mmap=True)
        if hit is None:
            raise DataError(f"the record cache {str(entry)!r} cannot be read back after writing it")
    arrays, meta = hit
    return ByteRecords(names=meta["names"][split], labels=np.array(arrays[names[0]]),
                       offsets=np.array(arrays[names[1]]), blob=arrays[names[2]], classes=meta["classes"])
