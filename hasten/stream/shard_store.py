"""Where the shards are: a store of tar shards on a file system, and how to open one.

A store is anything with ``len(store)``, ``store[i] -> bytes`` (shard i),
``names`` (shown in messages and used as cache keys), ``examples`` (examples per
shard), ``sizes`` (bytes per shard, or None when unknown) and ``classes``.
A store whose class also defines ``shard_records(i, lazy=)`` hands the loader its
examples as ``Record`` objects instead of tar bytes (``hasten.stream.virtual_shards``:
an image folder or the record blob cut into virtual shards). ``ShardFiles`` is the store
of local files; ``hasten.stream.slow_storage.SlowStorage`` and
``hasten.stream.shard_cache.ShardCache`` wrap any store and are one themselves;
``hasten.stream.sources.open_source`` opens whichever a path holds.

``open_shards`` reads a directory with the ``index.json`` that ``hasten data pack``
(``hasten.stream.pack``) writes (each shard's example count and size, and the class
names), a directory of ``shard-*.tar`` without an index (their counts from the tar
headers, one pass), or a list of shard paths; given a URL (s3://, gs://, https://,
...) it reads such a directory from object storage or a web server through a local
cache (``hasten.stream.remote_store``).

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from hasten.errors import DataError
from hasten.stream.store_url import is_url
from hasten.stream.tar_members import count_examples

INDEX = "index.json"
SHARD_GLOB = "shard-*.tar"


class ShardFiles:
    """Shards on a file system: ``shards[i]`` is the bytes of shard i.

    ``names``: shown in messages and used as cache keys; ``examples``: examples per
    shard; ``sizes``: bytes per shard when an index gives them (None otherwise);
    ``classes``: class names (empty when unknown).
    """

    def __init__(self, paths: Sequence[str | os.PathLike], names: Sequence[str], examples: Sequence[int],
                 sizes: Sequence[int | None] | None = None, classes: Sequence[str] = ()):
        if not len(paths) == len(names) == len(examples):
            raise ValueError("paths, names and examples must have one entry per shard")
        self.paths = [Path(p) for p in paths]
        self.names = list(names)
        self.examples = [int(c) for c in examples]
        self.sizes = list(sizes) if sizes is not None else [None] * len(paths)
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        try:
            return self.paths[i].read_bytes()
        except OSError as e:
            raise DataError(f"cannot read shard {self.names[i]}: {e.strerror or e}") from None

    def shard_file(self, i: int) -> Path:
        """Shard i as a local file (``hasten.stream.epoch_plan.plan_records`` scans it)."""
        return self.paths[i]

    def read_into(self, i: int, buffer: bytearray | None = None) -> tuple[bytearray, memoryview]:
        """Shard i read into ``buffer`` (grown when too small, else reused): (the buffer,
        a view of the shard's bytes in it). A loader that parses each shard and copies its
        records out reads every shard into the same few buffers instead of new memory
        (each new 64 MB is 16,000 page faults)."""
        try:
            with open(self.paths[i], "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if buffer is None or len(buffer) < size:
                    buffer = bytearray(size)
                view = memoryview(buffer)[:size]
                got = f.readinto(view)
                while got < size:  # readinto may return short reads (network file systems)
                    more = f.readinto(view[got:])
                    if not more:
                        break
                    got += more
        except OSError as e:
            raise DataError(f"cannot read shard {self.names[i]}: {e.strerror or e}") from None
        return buffer, view[:got]

    @property
    def total(self) -> int:
        return sum(self.examples)


def open_shards(path: str | os.PathLike | Sequence[str | os.PathLike], split: str = "train", *,
                retry=None) -> ShardFiles:
    """The shards of ``split`` at ``path``: a directory with ``index.json`` (what
    ``hasten data pack`` writes), a directory of ``shard-*.tar`` (its ``split``
    sub-folder when there is one), a list of shard paths, or the URL of a directory
    with an index (``hasten.stream.remote_cache.open_remote_shards``; ``retry``: its
    ``hasten.stream.retry.RetryPolicy``)."""
    if is_url(path):
        from hasten.stream.remote_cache import open_remote_shards

        return open_remote_shards(path, split, retry=retry)
    if isinstance(path, (str, os.PathLike)):
        root = Path(path).expanduser()
        if not root.is_dir():
            raise DataError(f"shard directory {str(root)!r} does not exist or is not a directory")
        if (root / INDEX).is_file():
            return _from_index(root, split)
        folder = root / split if (root / split).is_dir() else root
        paths = sorted(folder.glob(SHARD_GLOB))
        if not paths:
            raise DataError(f"{str(folder)!r} holds no {INDEX} and no {SHARD_GLOB} files; pack a folder or "
                            "archive with `hasten data pack SRC OUTDIR`")
    else:
        paths = [Path(p).expanduser() for p in path]
        if not paths:
            raise DataError("the list of shard paths is empty")
    names = [p.name for p in paths]
    return ShardFiles(paths, names, [count_examples(p) for p in paths])


def is_shard_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory of shards (an index, or ``shard-*.tar`` files); a
    URL is taken to be one (only shards are read from URLs; ``open_shards`` checks)."""
    if is_url(path):
        return True
    root = Path(path).expanduser()
    if not root.is_dir():
        return False
    return (root / INDEX).is_file() or any(root.glob(SHARD_GLOB)) or any(root.glob(f"*/{SHARD_GLOB}"))


def _from_index(root: Path, split: str) -> ShardFiles:
    try:
        index = json.loads((root / INDEX).read_text())
        entry = index["splits"][split]
        shards = entry["shards"]
        names = [s["name"] for s in shards]
        return ShardFiles([root / n for n in names], names, [int(s["examples"]) for s in shards],
                          [int(s["bytes"]) for s in shards], index.get("classes", []))
    except KeyError as e:
        raise DataError(f"{root / INDEX}: no {e} entry (splits present: "
                        f"{sorted(index.get('splits', {})) if isinstance(index, dict) else 'none'})") from None
    except (OSError, ValueError, TypeError) as e:
        raise DataError(f"{root / INDEX} is not a readable shard index ({type(e).__name__}: {e})") from None
