"""Raw-bytes record store: an image folder or archive read once, then random access.

A .tar.xz (or .tar.gz) archive can only be read front to back, which rules out
shuffled reading and per-rank sharding. ``open_records`` therefore makes one
sequential pass over the folder or archive and writes each split as a single
blob of the undecoded file bytes plus offsets, labels and names into the cache
(``$HASTEN_CACHE/records/<key>/``, keyed by the input's sha256 or tree
fingerprint). Later runs memory-map the blob: reading record i is a slice, and
worker processes forked from the reader share the same pages. The bytes stay
compressed (JPEG), so the cache is about the size of the image payload (55 MB
for CIFAR-10-JPEG), and decoding remains the streaming pipeline's job.

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hasten.data.archive import iter_files
from hasten.data.cache import cache_dir, entry_key, file_sha256, save_entry, tree_fingerprint
from hasten.errors import DataError

SPLITS = ("train", "test")
_FORMAT = 1


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


def _fingerprint(path: Path) -> str:
    if path.is_dir():
        return "dir:" + tree_fingerprint(path)
    return "file:" + file_sha256(path)


def _split_and_class(name: str) -> tuple[str, str] | None:
    parts = name.split("/")
    # Accept one optional top-level folder (archives often wrap everything in one).
    for start in (0, 1):
        rest = parts[start:]
        if len(rest) >= 3 and rest[0] in SPLITS and not rest[-1].startswith("."):
            return rest[0], rest[1]
    return None


def _build(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    found: dict[str, list[tuple[str, str, bytes]]] = {s: [] for s in SPLITS}
    for name, data in iter_files(path):
        where = _split_and_class(name)
        if where is not None:
            found[where[0]].append((where[1], name, data))
    classes = sorted({c for c, _, _ in found["train"]})
    if not classes:
        raise DataError(f"{str(path)!r} holds no files in the layout train/<class>/<file>; see `hasten echo --help`")
    unknown = sorted({c for c, _, _ in found["test"]} - set(classes))
    if unknown:
        raise DataError(f"{str(path)!r}: test classes {unknown} do not occur in train/ (classes: {classes})")
    index = {c: i for i, c in enumerate(classes)}
    arrays, meta = {}, {"format": _FORMAT, "classes": classes, "source": str(path), "names": {}}
    for split in SPLITS:
        items = sorted(found[split], key=lambda t: t[1])
        sizes = np.array([len(d) for _, _, d in items], dtype=np.int64)
        arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arrays[f"{split}_labels"] = np.array([index[c] for c, _, _ in items], dtype=np.int64)
        arrays[f"{split}_blob"] = np.frombuffer(b"".join(d for _, _, d in items), dtype=np.uint8)
        meta["names"][split] = [n for _, n, _ in items]
    return arrays, meta


def open_records(path: str | os.PathLike, split: str = "train", *, cache: str | os.PathLike | None = None) -> ByteRecords:
    """The ``split`` ("train" or "test") of an image folder or archive as ``ByteRecords``.

    The first call reads the whole input once and caches both splits; later calls
    map the cache. ``cache`` overrides the cache root (default ``$HASTEN_CACHE``).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {', '.join(SPLITS)}")
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"no such file or directory: {str(path)!r}")
    root = Path(cache) if cache is not None else cache_dir()
    entry = root / "records" / entry_key(_fingerprint(path), {"kind": "byte-records", "format": _FORMAT})
    if not (entry / "meta.json").is_file():
        arrays, meta = _build(path)
        save_entry(entry, arrays, meta)
    try:
        with open(entry / "meta.json") as f:
            meta = json.load(f)
        return ByteRecords(
            names=meta["names"][split],
            labels=np.load(entry / f"{split}_labels.npy"),
            offsets=np.load(entry / f"{split}_offsets.npy"),
            blob=np.load(entry / f"{split}_blob.npy", mmap_mode="r"),
            classes=meta["classes"],
        )
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"the record cache {str(entry)!r} is unreadable ({e}); delete it to rebuild") from None
