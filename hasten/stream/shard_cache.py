"""A local disk cache of shards read from slow or remote storage.

Training reads every shard once per epoch. When the shards live on a network
file system or object storage, the first epoch has to wait for them, but later
epochs need not: ``ShardCache`` keeps each shard it reads in a local directory,
up to ``max_bytes`` in all, evicting the least recently used shard when a new
one does not fit, and serves later reads from there. Files are written to a
temporary name and renamed, so a reader (another rank on the same host, or a
run after a crash) never sees half a shard; a cached file whose size differs
from the store's index is read from the store again.

It wraps any store with ``store[i] -> bytes`` and ``store.names`` (for example
``hasten.stream.shard_store.ShardFiles``, possibly behind ``SlowStorage``) and is one
itself, so ``ShardLoader`` takes it as is; other attributes (``examples``,
``classes``) pass through. With the cap smaller than the data, an epoch that
reads shards in a new order still finds the most recently used ones locally.

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019),
section on input pipelines ("sharing and caching" of the training data).

Changes the training math: no.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

from hasten.errors import DataError


class ShardCache:
    """``store[i]``, kept in ``directory`` (at most ``max_bytes``) after the first read."""

    def __init__(self, store, directory: str | os.PathLike, *, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0 (the cache's size cap); got {max_bytes!r}")
        self.store = store
        self.directory = Path(directory).expanduser()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create the shard cache {str(self.directory)!r}: {e.strerror or e}") from None
        self.max_bytes = max_bytes
        self.hits = self.misses = self.evictions = 0
        self._lock = threading.Lock()
        # Least recently used first; files left by an earlier run count, oldest first.
        found = [(p.stat().st_mtime, p.name, p.stat().st_size) for p in self.directory.glob("*.tar")]
        self._files: OrderedDict[str, int] = OrderedDict((n, s) for _, n, s in sorted(found))
        self._bytes = sum(self._files.values())

    def __len__(self) -> int:
        return len(self.store)

    def __getattr__(self, name: str):
        if name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    @property
    def nbytes(self) -> int:
        """Bytes now held in the cache directory."""
        return self._bytes

    def _file(self, i: int) -> str:
        # One flat directory: the shard's name (which may hold a split folder) made safe and unique.
        name = self.store.names[i]
        tag = hashlib.sha1(name.encode()).hexdigest()[:8]
        return f"{Path(name).stem}-{tag}.tar"

    def __getitem__(self, i: int) -> bytes:
        file = self._file(i)
        sizes = getattr(self.store, "sizes", None)
        expected = sizes[i] if sizes is not None else None
        path = self.directory / file
        with self._lock:
            known = file in self._files
            if known:
                self._files.move_to_end(file)
        # Looked for even when this process did not write it: another rank of the host (or
        # a run before) may have, since this cache listed the directory. Files appear only
        # whole (renamed into place), so one that is there is complete.
        try:
            data = path.read_bytes()
        except OSError:
            data = None  # not there (evicted by another process), or unreadable: read it from the store
        if data is not None and (expected is None or len(data) == expected):
            with self._lock:
                self.hits += 1
                if not known:
                    self._bytes += len(data) - self._files.pop(file, 0)
                    self._files[file] = len(data)
            try:
                os.utime(path)  # other processes sharing the directory see the use
            except OSError:
                pass
            return data
        data = self.store[i]
        with self._lock:
            self.misses += 1
        self._put(file, data)
        return data

    def _put(self, file: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return  # would evict everything and still not fit
        tmp = self.directory / f".{file}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.directory / file)
        except OSError:
            tmp.unlink(missing_ok=True)
            return  # a full or read-only disk makes the cache a no-op, not a failure
        with self._lock:
            self._bytes -= self._files.pop(file, 0)
            self._files[file] = len(data)
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                old, size = self._files.popitem(last=False)
                self._bytes -= size
                self.evictions += 1
                (self.directory / old).unlink(missing_ok=True)
