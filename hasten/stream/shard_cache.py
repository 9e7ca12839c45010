"""A local disk cache of shards read from slow or remote storage.

Training reads every shard once per epoch. When the shards live on a network
file system or object storage, the first epoch has to wait for them, but later
epochs need not: ``ShardCache`` keeps each shard it reads in a local directory,
up to ``max_bytes`` in all, evicting the least recently used shard when a new
one does not fit, and serves later reads from there. Files are written to a
temporary name and renamed, so a reader (another rank on the same host, or a
run after a crash) never sees half a shard; a cached file whose size differs
from the store's index is read from the store again. The cap is the directory's: the ranks
of a host sharing it evict from what it holds, least recently used by any of them first.

It wraps any store with ``store[i] -> bytes`` and ``store.names`` (for example
``hasten.stream.shard_store.ShardFiles``, possibly behind ``SlowStorage``) and is one
itself, so ``ShardLoader`` takes it as is; other attributes (``examples``,
``classes``) pass through. With the cap smaller than the data, an epoch that
reads shards in a new order still finds the most recently used ones locally.

``shard_file(i)`` gives shard i as a complete local file instead of its bytes, fetched
into the cache first when it is not there (a store with ``write_to(i, fd)``, such as
``hasten.stream.remote_store.RemoteShards``, writes each part straight into the file as
it arrives: the shard is never whole in memory). The loader then reads it like any
local shard: it scans the tar headers and the decode workers read each image from the
file (``hasten.stream.tar_members.scan_shard``). That needs the file to stay put until
the epoch's images are decoded, so it is offered only when nothing is ever evicted:
the cap holds the whole split (its sizes known from an index). Otherwise the shard is
read whole, as ``cache[i]``.

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019),
section on input pipelines ("sharing and caching" of the training data).

Changes the training math: no.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
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
        self._split_bytes: int | None = None  # the split's bytes (-1: unknown), once asked
        self._lock = threading.Lock()
        # Least recently used first; files left by an earlier run count, oldest first.
        self._files: OrderedDict[str, int] = self._listed()
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

    def _expected(self, i: int) -> int | None:
        sizes = getattr(self.store, "sizes", None)
        return sizes[i] if sizes is not None else None

    def _touch(self, file: str) -> bool:
        """Marks ``file`` most recently used; whether this cache already counted it."""
        with self._lock:
            known = file in self._files
            if known:
                self._files.move_to_end(file)
        return known

    def _listed(self) -> OrderedDict[str, int]:
        """The directory's shards and sizes, least recently used first. The last use is the
        access time, which every use sets (``_used``), whichever process sharing the directory made it."""
        found = []
        for path in self.directory.glob("*.tar"):
            try:
                st = path.stat()
            except OSError:
                continue  # evicted by another process meanwhile
            found.append((st.st_atime_ns, path.name, st.st_size))
        return OrderedDict((n, s) for _, n, s in sorted(found))

    def _used(self, file: str) -> None:
        try:
            # Other processes sharing the directory see the use. The access time only: a scanned
            # file's modification time is part of its identity (``tar_members.read_member``), and
            # a new one would make the images its workers still have to read look rewritten. Set
            # from the clock, not left to the kernel's coarser one, so uses order as they happened.
            path = self.directory / file
            os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
        except OSError:
            pass

    def _found(self, file: str, size: int, known: bool) -> None:
        with self._lock:
            self.hits += 1
            if not known:
                self._bytes += size - self._files.pop(file, 0)
                self._files[file] = size
        self._used(file)

    def __getitem__(self, i: int) -> bytes:
        file, expected = self._file(i), self._expected(i)
        known = self._touch(file)
        # Looked for even when this process did not write it: another rank of the host (or
        # a run before) may have, since this cache listed the directory. Files appear only
        # whole (linked or renamed into place), so one that is there is complete.
        try:
            data = (self.directory / file).read_bytes()
        except OSError:
            data = None  # not there (evicted by another process), or unreadable: read it from the store
        if data is not None and (expected is None or len(data) == expected):
            self._found(file, len(data), known)
            return data
        data = self.store[i]
        with self._lock:
            self.misses += 1
        self._put(file, data)
        return data

    def keeps_everything(self) -> bool:
        """Whether nothing can be evicted: the split's sizes are known and fit under the cap."""
        if self._split_bytes is None:  # (summed once: asked for every shard of every epoch)
            sizes = getattr(self.store, "sizes", None)
            self._split_bytes = sum(sizes) if sizes is not None and None not in sizes else -1
        return 0 <= self._split_bytes <= self.max_bytes

    def shard_file(self, i: int) -> Path | None:
        """Shard i as a complete file in the cache (its size checked against the index),
        fetched into it first when missing; None when the cache may evict (``keeps_everything``
        is false: read ``cache[i]`` instead) or cannot write to its disk."""
        if not self.keeps_everything():
            return None
        file, expected = self._file(i), self._expected(i)
        path = self.directory / file
        known = self._touch(file)
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        if size == expected:
            self._found(file, size, known)
            return path
        tmp = self._tmp(file)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError:
            return None
        try:
            try:
                # Looked up on the class: one forwarded by a wrapper (SlowStorage) would skip the wrapper.
                if hasattr(type(self.store), "write_to"):
                    self.store.write_to(i, fd)  # part by part, as they arrive (read back to be hashed)
                else:
                    _write_all(fd, self.store[i])
                written = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if written != expected:  # (the store checked every part; this holds unless the disk lied)
                raise OSError(f"{written} bytes written, the index says {expected}")
            with self._lock:
                self.misses += 1
            self._place(file, tmp, written)
        except OSError:
            return None  # a full or read-only disk: the caller reads the shard whole
        finally:
            tmp.unlink(missing_ok=True)
        return path if path.exists() else None

    def _tmp(self, file: str) -> Path:
        return self.directory / f".{file}.{os.getpid()}.{threading.get_ident()}.tmp"

    def _put(self, file: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return  # would evict everything and still not fit
        tmp = self._tmp(file)
        try:
            tmp.write_bytes(data)
            self._place(file, tmp, len(data))
        except OSError:
            return  # a full or read-only disk makes the cache a no-op, not a failure
        finally:
            tmp.unlink(missing_ok=True)

    def _place(self, file: str, tmp: Path, size: int) -> None:
        """Moves the complete ``tmp`` into place as ``file`` and evicts what no longer fits."""
        dest = self.directory / file
        try:
            # A hard link, not a rename over: a complete copy another rank put there first stays
            # (its scanned offsets may be in use by that rank's decode workers).
            os.link(tmp, dest)
        except FileExistsError:
            try:
                theirs = dest.stat().st_size
            except OSError:
                theirs = None
            if theirs != size:  # a damaged copy, or none any more: ours replaces it
                os.replace(tmp, dest)
        except OSError:
            os.replace(tmp, dest)  # a file system without hard links
        self._used(file)
        with self._lock:
            # The ranks of a host place and use shards in one directory, and the cap is the
            # directory's: what it holds now is evicted from, the least recently used by any of
            # them first (counting only this process's files let it grow to one cap per rank).
            self._files = self._listed()
            self._bytes = sum(self._files.values())
            while self._bytes > self.max_bytes and self._files:
                old, old_size = self._files.popitem(last=False)
                self._bytes -= old_size
                self.evictions += 1
                (self.directory / old).unlink(missing_ok=True)


def _write_all(fd: int, data) -> None:
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.write(fd, view[done:])
