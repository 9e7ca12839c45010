"""Tar shards in the web-dataset layout: data larger than memory, read as a stream.

A shard is a plain tar file, ``shard-000123.tar``, holding each example as
consecutive members with one key: ``KEY.jpg`` (or .jpeg, .png) and ``KEY.cls``
(the label as decimal text) or ``KEY.json`` (``{"label": 3}``). ``hasten data
pack`` (``hasten.stream.pack``) writes them with an ``index.json`` holding each
shard's example count and size and the class names; ``open_shards`` also reads
shards without an index (their counts from the tar headers, one pass).

Per epoch, ``epoch_plan`` orders the shards by a permutation of (seed, epoch),
the examples inside each shard by another, and cuts the resulting sequence into
``world_size`` contiguous ranges that differ by at most one example: every
example goes to exactly one rank once per epoch (the guarantee of
``hasten.stream.rank_split.rank_indices``), and a rank reads its own shards plus
at most two shared at the ends of its range. A shuffle buffer
(``hasten.echo.stages.shuffle_buffer``) then mixes each rank's stream. All of it
is computed on example numbers, from the counts, before any byte is read, so a
mid-epoch position (epoch, examples already delivered) names exactly the
examples still to come: resuming reads only the shards that still hold some of
them, and decodes only those.

Memory stays bounded whatever the size of the set: ``prefetch`` shards read
ahead, one shard's worth of examples waiting for their turn in the in-shard
shuffle, ``shuffle_buffer`` undecoded examples, and ``prefetch`` decoded chunks.
Shards come through any store with ``store[i] -> bytes``: ``ShardFiles`` (a file
system), possibly behind ``hasten.stream.slow_storage.SlowStorage`` and
``hasten.stream.shard_cache.ShardCache``. Local shard files are not read by the
loading process: it scans their tar headers (``scan_shard``) and the decode workers
read each image's bytes where they decode it (``read_member``), so the examples in
the buffers are a few dozen bytes each; shards from other stores are read whole.
Decoding is ``hasten.stream.fused_crop`` in the worker pool of ``hasten.data.workers``.

Bad input: an undecodable image or a missing or unreadable label is skipped and
counted by name (``shard-000003.tar:00001234.jpg``), as in every hasten reader,
until more than ``max_bad_fraction`` were bad; a truncated or damaged shard
stops the stream with one ``DataError`` naming it.

Based on: the WebDataset format (Breuel et al., 2020); Kumar et al., "Scale
MLPerf-0.6 models on Google TPU-v3 Pods" (2019) for sharded, cached, prefetched input.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import tarfile
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from hasten.data.decode import BadImageError, bad_reason, check_bad_fraction
from hasten.data.workers import ordered_map
from hasten.echo.stages import check_buffer_size, shuffle_buffer
from hasten.errors import DataError
from hasten.stream.decode_pool import MIN_COUNTED
from hasten.stream.fused_crop import ExampleRngs, fused_crop
from hasten.stream.loader import to_device

INDEX = "index.json"
SHARD_GLOB = "shard-*.tar"
IMAGE_SUFFIXES = ("jpg", "jpeg", "png")
LABEL_SUFFIXES = ("cls", "json")


# ----------------------------------------------------------------------------
# Where the shards are
# ----------------------------------------------------------------------------

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


def open_shards(path: str | os.PathLike | Sequence[str | os.PathLike], split: str = "train") -> ShardFiles:
    """The shards of ``split`` at ``path``: a directory with ``index.json`` (what
    ``hasten data pack`` writes), a directory of ``shard-*.tar`` (its ``split``
    sub-folder when there is one), or a list of shard paths."""
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
    """Whether ``path`` is a directory of shards (an index, or ``shard-*.tar`` files)."""
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


def count_examples(path: str | os.PathLike) -> int:
    """Examples (distinct consecutive keys) in a shard, from its tar headers only."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:") as tf:
            return sum(1 for _ in _group_keys(m.name for m in tf if m.isfile()))
    except (OSError, tarfile.TarError, EOFError) as e:
        raise DataError(f"{path.name}: truncated or damaged shard ({type(e).__name__}: {e}); copy it again "
                        "or re-run hasten data pack") from None


def _split_key(name: str) -> tuple[str, str]:
    # web-dataset convention: the key is everything before the first dot of the file name.
    folder, _, base = name.rpartition("/")
    key, _, suffix = base.partition(".")
    return (f"{folder}/{key}" if folder else key), suffix.lower()


def _group_keys(names) -> Iterator[str]:
    previous = None
    for name in names:
        key, _ = _split_key(name)
        if key != previous:
            yield key
            previous = key


# ----------------------------------------------------------------------------
# Reading one shard
# ----------------------------------------------------------------------------

@dataclass
class Record:
    """One example, undecoded: ``name`` for messages; ``reason`` set when it is bad."""

    key: int  # global example number: the shard's offset + the example's place in it
    name: str
    data: bytes | None
    label: int
    reason: str | None = None
    # (shard file, offset, size, the file's identity when scanned) of the image's bytes, when
    # the worker that decodes it reads them itself (``scan_shard``) instead of receiving them.
    where: tuple[str, int, int, tuple[int, int, int]] | None = None


def read_shard(data: bytes, name: str, *, expected: int | None = None, size: int | None = None) -> list[Record]:
    """The examples of one shard, in file order (``key`` counts from 0).

    ``expected`` examples and ``size`` bytes (from an index) are checked; a shard
    that is cut short or damaged raises one ``DataError`` naming it.
    """
    if size is not None and len(data) != size:
        raise _truncated(name, f"it is {len(data)} bytes, the index says {size}")
    # A complete tar ends with two zero blocks; a copy cut off anywhere else does not.
    if len(data) < 1024 or len(data) % 512 or any(bytes(data[-1024:])):
        raise _truncated(name, "it does not end with the tar end-of-archive blocks")
    members = _plain_members(data, name)
    if members is None:  # a tar extension (pax headers, long names): the standard library reads it
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
                members = [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]
        except (tarfile.TarError, EOFError, OSError) as e:
            raise _truncated(name, f"{type(e).__name__}: {e}") from None
    groups: list[tuple[str, dict[str, bytes]]] = []
    for member, content in members:
        key, suffix = _split_key(member)
        if not groups or groups[-1][0] != key:
            groups.append((key, {}))
        groups[-1][1][suffix] = content
    if expected is not None and len(groups) != expected:
        raise _truncated(name, f"it holds {len(groups)} examples, the index says {expected}")
    return [_record(k, f"{name}:{key}", parts) for k, (key, parts) in enumerate(groups)]


_ZERO_BLOCK = bytes(512)


class _Extension(Exception):
    """A tar header this reader leaves to ``tarfile`` (pax, GNU long names, links, ...)."""


def _header(header: bytes, offset: int, n: int, name: str) -> tuple[str | None, int]:
    """(member name, or None for a directory; content size) of the plain ustar/GNU tar
    header at ``offset`` of a file of ``n`` bytes. Raises ``_Extension`` for what only
    ``tarfile`` reads, ``DataError`` for a damaged header or a member cut off."""
    kind = header[156:157]
    if kind not in (b"0", b"\0", b"5"):
        raise _Extension  # pax or GNU long-name headers, links, ...
    try:
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        checksum = int(header[148:156].split(b"\0", 1)[0].strip(), 8)
    except ValueError:
        raise _Extension from None  # base-256 sizes of huge members, or a damaged header: tarfile decides
    if checksum != sum(header) - sum(header[148:156]) + 8 * 32:
        raise _truncated(name, f"bad tar header checksum at byte {offset}")
    if offset + 512 + size > n:
        raise _truncated(name, f"a member ends past the end of the file (byte {offset + 512 + size} of {n})")
    if kind == b"5":
        return None, size
    member = header[:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\x00" and header[345] != 0:  # POSIX ustar: a name prefix
        member = header[345:500].split(b"\0", 1)[0] + b"/" + member
    return member.decode("utf-8", "surrogateescape"), size


def _walk(read, n: int, name: str) -> list[tuple[str, int, int]] | None:
    """(member name, content offset, size) of the regular files of a plain ustar/GNU tar of
    ``n`` bytes, from its headers (``read(offset, count) -> bytes``); None when the shard
    uses something else, for tarfile to read."""
    out, offset = [], 0
    while offset + 512 <= n:
        header = read(offset, 512)
        if header == _ZERO_BLOCK:
            return out
        try:
            member, size = _header(header, offset, n, name)
        except _Extension:
            return None
        start = offset + 512
        if member is not None:
            out.append((member, start, size))
        offset = start + -(-size // 512) * 512
    raise _truncated(name, "it does not end with the tar end-of-archive blocks")


def _plain_members(data: bytes, name: str) -> list[tuple[str, bytes]] | None:
    """(name, bytes) of the regular files of a plain ustar/GNU tar, read from its
    headers directly (tarfile's per-member objects cost about as much as a small
    decode); None when the shard uses something else, for tarfile to read."""
    members = _walk(lambda offset, count: bytes(data[offset:offset + count]), len(data), name)
    # bytes(...) copies out of a reused buffer (a memoryview); on bytes, slicing already copied.
    return None if members is None else [(m, bytes(data[start:start + size])) for m, start, size in members]


def scan_shard(path: str | os.PathLike, name: str, *, expected: int | None = None,
               size: int | None = None) -> list[Record] | None:
    """``read_shard`` without reading the images: the examples of a local shard file from
    its tar headers (one small read per member), each image as ``Record.where`` (file,
    offset, size) for the decode worker to read, labels read here. The checks are
    ``read_shard``'s. None when the tar uses extensions (the caller reads it whole).

    Why: read whole, every image's bytes would be copied three times in the loading process
    (the shard into memory, the record out of it, the batch into shared memory); read
    where it is decoded, once, in the worker, from the page cache."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DataError(f"cannot read shard {name}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        n, ident = st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns)
        if size is not None and n != size:
            raise _truncated(name, f"it is {n} bytes, the index says {size}")
        if n < 1024 or n % 512 or any(os.pread(fd, 1024, n - 1024)):
            raise _truncated(name, "it does not end with the tar end-of-archive blocks")
        members = _walk(lambda offset, count: os.pread(fd, count, offset), n, name)
        if members is None:
            return None
        # Labels are read here (a few bytes each); images stay where they are.
        contents = [b"" if _split_key(m)[1] in IMAGE_SUFFIXES else os.pread(fd, length, start)
                    for m, start, length in members]
    except OSError as e:
        raise DataError(f"cannot read shard {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    groups: list[tuple[str, dict[str, bytes], dict[str, tuple[int, int]]]] = []
    for (member, start, length), content in zip(members, contents):
        key, suffix = _split_key(member)
        if not groups or groups[-1][0] != key:
            groups.append((key, {}, {}))
        groups[-1][1][suffix] = content
        groups[-1][2][suffix] = (start, length)
    if expected is not None and len(groups) != expected:
        raise _truncated(name, f"it holds {len(groups)} examples, the index says {expected}")
    out, where = [], os.path.abspath(path)  # the workers may not share this process's working directory
    for k, (key, parts, spans) in enumerate(groups):
        r = _record(k, f"{name}:{key}", parts)
        if r.reason is None:
            image = next(s for s in IMAGE_SUFFIXES if s in parts)
            r.data, r.where = None, (where, *spans[image], ident)
        out.append(r)
    return out


_FILES: dict[tuple, int] = {}  # (shard file, identity) -> descriptor, per process: a worker reads many images
_FILES_LOCK = threading.Lock()  # without workers, several loaders' feeder threads share the cache
_MAX_FILES = 16


def read_member(where: tuple[str, int, int, tuple[int, int, int]]) -> bytes:
    """The bytes at (file, offset, size) of the file as ``scan_shard`` saw it;
    ``OSError`` when they cannot all be read or the file is no longer that file (a
    shard copied over since: its offsets would point into other bytes)."""
    path, offset, size, ident = where
    ident = tuple(ident)
    # Held while reading too: another thread must not close (and the system reuse) this
    # descriptor between the lookup and the read.
    with _FILES_LOCK:
        fd = _FILES.get((path, ident))
        if fd is None:
            if len(_FILES) >= _MAX_FILES:  # the oldest first: shards are read one after another
                os.close(_FILES.pop(next(iter(_FILES))))
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            _FILES[(path, ident)] = fd
        st = os.fstat(fd)  # every read: a file rewritten in place keeps its inode, not its mtime
        if (st.st_dev, st.st_ino, st.st_mtime_ns) != ident:
            os.close(_FILES.pop((path, ident)))
            raise OSError("the shard file changed after it was scanned")
        data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"{len(data)} of {size} bytes at byte {offset}: the file is shorter than when it was scanned")
    return data


def close_files() -> None:
    """Close the descriptors ``read_member`` keeps open in this process."""
    with _FILES_LOCK:
        while _FILES:
            os.close(_FILES.popitem()[1])


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock would leave it held forever in the child.
    global _FILES_LOCK
    _FILES_LOCK = threading.Lock()
    close_files()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _with_bytes(r: Record) -> Record:
    """``r`` with its image bytes in ``data`` (read from ``where``), or marked bad if unreadable."""
    if r.where is None or r.reason is not None:
        return r
    try:
        return Record(r.key, r.name, read_member(r.where), r.label)
    except OSError as e:
        return Record(r.key, r.name, None, r.label, f"cannot read its bytes ({e.strerror or e})")


def _truncated(name: str, why: str) -> DataError:
    return DataError(f"shard {name} is truncated or damaged ({why}); copy it again or re-run hasten data pack")


def _record(k: int, name: str, parts: dict[str, bytes]) -> Record:
    image = next((s for s in IMAGE_SUFFIXES if s in parts), None)
    if image is None:
        return Record(k, name, None, -1, f"no image member ({', '.join(sorted(parts)) or 'empty'})")
    name = f"{name}.{image}"
    try:
        if "cls" in parts:
            label = int(parts["cls"].decode().strip())
        elif "json" in parts:
            meta = json.loads(parts["json"])
            label = int(meta["label"] if isinstance(meta, dict) and "label" in meta else
                        meta["cls"] if isinstance(meta, dict) else meta)
        else:
            return Record(k, name, None, -1, "no label member (.cls or .json)")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return Record(k, name, None, -1, f"unreadable label ({type(e).__name__}: {e})")
    if label < 0:
        return Record(k, name, None, -1, f"negative label {label}")
    return Record(k, name, parts[image], label)


def default_image_size(store, *, largest: int = 224, samples: int = 64) -> int:
    """The training size when none is given: ``largest`` (ImageNet's 224), or the
    shorter side of the images when even the biggest of the first ``samples``
    examples (first shard, from the image headers) is smaller. Small images
    (CIFAR-10's 32 px) then train at their own size instead of being upsampled
    to 224 px: 49x the pixels for the model, the resize and the normalisation, and no
    more information."""
    if not len(store):
        return largest
    from hasten.stream.fused_crop import image_size_of

    sides = []
    for r in read_shard(store[0], store.names[0])[:samples]:
        if r.reason is None:
            try:
                sides.append(min(image_size_of(r.data, r.name)))
            except BadImageError:
                continue  # counted where it is decoded
    return min(largest, max(sides)) if sides else largest


# ----------------------------------------------------------------------------
# One epoch's plan, on example numbers only
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class EpochPlan:
    """Which examples a rank delivers in one epoch, in which order.

    The epoch's global sequence is ``shard_order`` with each shard's examples in
    its own permutation; this rank owns positions ``start`` to ``stop`` of it and
    delivers them in the order ``order`` (indices into its range, after the shuffle buffer).
    """

    shard_order: np.ndarray  # shard numbers in reading order
    shard_start: np.ndarray  # global position of each shard's first example (by shard number)
    start: int
    stop: int
    order: np.ndarray  # int64 (stop - start,)
    seed: int
    epoch: int
    shuffle: bool

    def __len__(self) -> int:
        return self.stop - self.start

    def member_order(self, shard: int, count: int) -> np.ndarray:
        """The permutation of one shard's examples this epoch (example i goes to place perm[i])."""
        if not self.shuffle:
            return np.arange(count)
        return np.random.default_rng([self.seed & 0xFFFFFFFF, self.epoch, shard + 1]).permutation(count)


def epoch_plan(counts: Sequence[int], *, epoch: int, seed: int = 0, rank: int = 0, world_size: int = 1,
               shuffle: bool = True, buffer: int = 0) -> EpochPlan:
    """The ``EpochPlan`` of one rank (see the module docstring); pure arithmetic on ``counts``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size - 1}]; got {rank!r}")
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    shard_order = (np.random.default_rng([seed & 0xFFFFFFFF, epoch]).permutation(len(counts)) if shuffle
                   else np.arange(len(counts)))
    shard_start = np.empty(len(counts), dtype=np.int64)
    shard_start[shard_order] = np.concatenate([[0], np.cumsum(counts[shard_order])[:-1]]) if len(counts) else []
    start, stop = n * rank // world_size, n * (rank + 1) // world_size
    size = stop - start
    if shuffle and buffer > 1:
        mixed = shuffle_buffer(range(size), buffer, seed=(seed * 1_000_003 + epoch) * 1_000_003 + rank)
        order = np.fromiter(mixed, dtype=np.int64, count=size)
    else:
        order = np.arange(size, dtype=np.int64)
    return EpochPlan(shard_order, shard_start, start, stop, order, seed, epoch, shuffle)


def plan_records(store, plan: EpochPlan, position: int = 0, *, prefetch: int = 2,
                 lazy: bool = False) -> Iterator[tuple[int, Record]]:
    """(place in the rank's order, ``Record``) from ``position`` on, reading from
    ``store`` only the shards that still hold examples due, ``prefetch`` at a time.

    ``lazy``: local shard files (``ShardFiles``) are scanned, not read (``scan_shard``):
    the records carry where their images are (``Record.where``), for the decoder to read."""
    counts = np.asarray(store.examples, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else np.zeros(0, np.int64)
    remaining = plan.order[position:]
    due = np.zeros(len(plan), dtype=bool)
    due[remaining] = True
    wanted = []
    for s in plan.shard_order.tolist():
        first, last = plan.shard_start[s] - plan.start, plan.shard_start[s] + counts[s] - plan.start
        lo, hi = max(first, 0), min(last, len(plan))
        if lo < hi and due[lo:hi].any():
            wanted.append(s)
    sizes = getattr(store, "sizes", None)
    pending: dict[int, Record] = {}
    t = position
    pool = ThreadPoolExecutor(max_workers=max(1, prefetch), thread_name_prefix="hasten-shard")
    # Local shard files are read into reused buffers (records are copied out when parsed);
    # other stores (slow or remote storage, caches) hand over new bytes.
    buffers: deque[bytearray] = deque()

    def read(s: int):
        if lazy and isinstance(store, ShardFiles) and hasattr(os, "pread"):  # (not on Windows)
            scanned = scan_shard(store.paths[s], store.names[s], expected=int(counts[s]),
                                 size=sizes[s] if sizes is not None else None)
            if scanned is not None:
                return None, None, scanned
        if isinstance(store, ShardFiles):
            try:
                buffer = buffers.popleft()  # (two reader threads may race for the last one)
            except IndexError:
                buffer = None
            return (*store.read_into(s, buffer), None)
        return None, store[s], None

    try:
        # Shards are read ``prefetch`` ahead: reads from slow storage overlap like concurrent requests.
        futures = [pool.submit(read, s) for s in wanted[:prefetch]]
        for i, s in enumerate(wanted):
            buffer, data, records = futures[i].result()
            futures[i] = None  # the shard's bytes are freed (or their buffer reused) once parsed
            if i + prefetch < len(wanted):
                futures.append(pool.submit(read, wanted[i + prefetch]))
            if records is None:
                records = read_shard(data, store.names[s], expected=int(counts[s]),
                                     size=sizes[s] if sizes is not None else None)
            if isinstance(data, memoryview):
                data.release()
            del data
            if buffer is not None:
                buffers.append(buffer)
            place = plan.member_order(s, len(records))
            for member, record in enumerate(records):
                j = int(plan.shard_start[s] + place[member] - plan.start)
                if 0 <= j < len(plan) and due[j]:
                    record.key = int(offsets[s]) + member
                    pending[j] = record
            while t < len(plan) and int(plan.order[t]) in pending:
                yield t, pending.pop(int(plan.order[t]))
                t += 1
    finally:
        # A consumer that stops early does not wait for reads nobody will use.
        pool.shutdown(wait=False, cancel_futures=True)
    if t != len(plan) or pending:
        raise DataError(f"internal: {len(plan) - t} examples of the epoch never read, {len(pending)} never due")


# ----------------------------------------------------------------------------
# Decoding, in worker processes
# ----------------------------------------------------------------------------

@dataclass
class DecodedChunk:
    images: torch.Tensor | None  # (k, S, S, 3) uint8; None: written into the chunk's BatchPool buffer
    labels: np.ndarray  # int64 (k,)
    keys: np.ndarray  # int64 (k,) global example numbers
    places: np.ndarray  # int64 (k,) place in the rank's order
    end: int  # place after the chunk's last record (good or bad)
    bad: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class PackedChunk:
    """A chunk on its way to a decode worker: the records without their bytes, and the
    bytes of all of them in one shared-memory buffer (record i is ``buffer[ends[i-1]:ends[i]]``).
    The worker receives a file descriptor instead of about 100 KB per image written
    through a pipe and unpickled, which cost the loading process more CPU than anything
    else it did."""
    buffer: torch.Tensor  # uint8, in shared memory
    ends: np.ndarray  # int64 (k,)
    records: list[tuple[int, Record]]  # (place, Record with data=None)
    out: torch.Tensor | None = None  # a BatchPool buffer (shared) for the crops, or None: a new one

    def __len__(self) -> int:
        return len(self.records)

    def unpacked(self) -> list[tuple[int, Record]]:
        view, start, out = self.buffer.numpy(), 0, []
        for (place, r), end in zip(self.records, self.ends.tolist()):
            if r.where is not None or r.reason is not None:
                out.append((place, _with_bytes(r)))  # the worker reads the image itself
            else:
                out.append((place, Record(r.key, r.name, view[start:end].tobytes(), r.label)))
            start = end
        return out


def shared_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """A uint8 tensor allocated in shared memory, as DataLoader's collate allocates in its
    workers (``share_memory_()`` would allocate it privately, then copy it there)."""
    n = max(1, int(np.prod(shape)))
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # pragma: no cover - older torch
        return torch.empty(shape, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n), 0, shape)


class BufferPool:
    """Shared-memory buffers for packed chunks, reused: the loading process knows when a
    worker is done with one (its result has arrived; results come in order), and a
    fresh shared buffer costs more than the copy into it (page faults, zeroing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []
        self._out: deque[torch.Tensor] = deque()

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.numel() >= nbytes]
            if fits:  # the smallest that fits (by index: == on tensors compares elements)
                buffer = self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
            else:
                buffer = shared_uint8((max(1, int(nbytes * 1.25)),))  # room for a larger chunk later
            self._out.append(buffer)
        return buffer[:max(1, nbytes)]

    def release_oldest(self) -> None:
        with self._lock:
            if self._out:
                self._free.append(self._out.popleft())


class BatchPool:
    """Shared-memory batches reused from chunk to chunk: a decode worker writes its crops
    into a buffer the loading process owns (sent with the task), and the consumer's batch
    is a view of it. A fresh shared batch costs a page fault and a page of zeroes per 4 KB
    on its first write (measured: a 224 px crop resized into a fresh buffer 0.30 ms, into
    a reused one 0.19).

    A buffer is handed to a worker again only once nothing outside the pool refers to its
    memory: no batch, view or numpy array of it is alive (torch's count of the tensors on
    its storage), so a batch that the consumer keeps (a list, an echo buffer) is never
    written over; at most ``cap`` buffers, beyond that the worker allocates a new batch
    (``take`` returns None). Without torch's count (a private function) nothing is reused."""

    _count = getattr(torch._C, "_storage_Use_Count", None)

    def __init__(self, shape: tuple[int, ...], cap: int) -> None:
        self.shape, self.cap = tuple(shape), int(cap)
        self._lock = threading.Lock()
        self._buffers: list[torch.Tensor] = []
        self._base: list[int] = []  # each buffer's count while only the pool holds it
        self._busy: set[int] = set()  # sent to a worker, its result not back yet
        self._in_flight: deque[int | None] = deque()
        self.reused = self.created = self.unpooled = 0

    def _refs(self, i: int) -> int:
        return self._count(self._buffers[i].untyped_storage()._cdata)

    def take(self) -> torch.Tensor | None:
        """A free buffer for the next chunk sent (in the order results will arrive), or None."""
        with self._lock:
            if self._count is not None:
                for i in range(len(self._buffers)):
                    if i not in self._busy and self._refs(i) <= self._base[i]:
                        self._busy.add(i)
                        self._in_flight.append(i)
                        self.reused += 1
                        return self._buffers[i]
                if len(self._buffers) < self.cap:
                    self._buffers.append(shared_uint8(self.shape))
                    i = len(self._buffers) - 1
                    self._base.append(self._refs(i))
                    self._busy.add(i)
                    self._in_flight.append(i)
                    self.created += 1
                    return self._buffers[i]
            self._in_flight.append(None)
            self.unpooled += 1
            return None

    def arrived(self, n: int) -> torch.Tensor | None:
        """The first ``n`` crops of the buffer of the oldest chunk in flight, whose result
        has just arrived (None if it had no buffer); from now on the buffer is free as soon
        as nothing refers to it. The view is made before the buffer stops being busy (under
        the lock): a ``take`` in the feeder thread in between must not find it free."""
        with self._lock:
            i = self._in_flight.popleft() if self._in_flight else None
            if i is None:
                return None
            view = self._buffers[i][:n]
            self._busy.discard(i)
            return view


def pack_chunk(chunk: list[tuple[int, Record]], pool: BufferPool | None = None,
               batches: "BatchPool | None" = None) -> PackedChunk:
    """``chunk``'s bytes copied once into a shared-memory buffer (see ``PackedChunk``)."""
    ends = np.cumsum([len(r.data) if r.reason is None and r.data is not None else 0 for _, r in chunk],
                     dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    buffer = pool.take(total) if pool is not None else shared_uint8((max(1, total),))
    view, start = buffer.numpy(), 0
    for (_, r), end in zip(chunk, ends.tolist()):
        if end > start:
            view[start:end] = np.frombuffer(r.data, np.uint8)
        start = end
    return PackedChunk(buffer, ends, [(place, Record(r.key, r.name, None, r.label, r.reason, r.where))
                                      for place, r in chunk], batches.take() if batches is not None else None)


def decode_chunk(chunk: list[tuple[int, Record]] | PackedChunk, *, image_size: int, seed: int, epoch: int,
                 train: bool, antialias: bool = False) -> DecodedChunk:
    """Fused decode + crop of a list of (place, Record); bad ones are listed, not raised."""
    if mp.parent_process() is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)  # one thread per worker process, as in DataLoader workers
    out = chunk.out if isinstance(chunk, PackedChunk) else None
    chunk = chunk.unpacked() if isinstance(chunk, PackedChunk) else [(place, _with_bytes(r)) for place, r in chunk]
    labels, keys, places, bad = [], [], [], []
    shape = (len(chunk), image_size, image_size, 3)
    if out is not None and (out.shape[0] < len(chunk) or tuple(out.shape[1:]) != shape[1:]):
        out = None  # (not this chunk's size: a new batch)
    # In a worker, in shared memory from the start: the chunk then travels to the consumer as
    # a file descriptor (torch's pickling of shared tensors), not as bytes through a pipe; or
    # into the loading process's reused buffer, which does not travel back at all.
    if out is not None:
        stacked = out[:len(chunk)]
    elif mp.parent_process() is not None:
        stacked = shared_uint8(shape)
    else:
        stacked = torch.empty(shape, dtype=torch.uint8)
    view = stacked.numpy()
    rngs = ExampleRngs()  # example_rng's streams, without making a generator per example
    for place, r in chunk:
        if r.reason is not None:
            bad.append((r.name, r.reason))
            continue
        try:
            rng = rngs(seed, epoch, r.key) if train else None
            # Each crop is written straight into its slot of the chunk (no second copy).
            fused_crop(r.data, r.name, image_size, rng=rng, out=view[len(keys)], antialias=antialias)
        except BadImageError as e:
            bad.append((r.name, bad_reason(e, r.name)))
            continue
        labels.append(r.label)
        keys.append(r.key)
        places.append(place)
    return DecodedChunk(stacked[:len(keys)] if out is None else None, np.asarray(labels, np.int64),
                        np.asarray(keys, np.int64), np.asarray(places, np.int64), chunk[-1][0] + 1 if chunk else 0,
                        bad)


def _chunked(items, size: int):
    group = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


# ----------------------------------------------------------------------------
# The loader
# ----------------------------------------------------------------------------

class ShardLoader:
    """Batches of fused-decoded crops streamed from tar shards, sharded over ranks.

    ``shards``: a store (``open_shards(path)``, maybe behind ``SlowStorage`` and
    ``ShardCache``). ``train=True``: random-resized crop and flip, shuffled shards,
    examples and buffer; ``train=False``: centre crop, file order. Yields (images
    uint8 (B, 3, S, S) in channels_last memory format, labels int64 (B,)), with
    ``with_keys`` also the global example numbers. ``prefetch``: shards read ahead
    (and decoded chunks in flight, at least two per worker); ``shuffle_buffer``:
    undecoded examples mixed per rank; with the shard size, these bound the memory.
    ``chunk_size``: examples a worker decodes per task (default: a batch).
    ``antialias``: resize crops with the antialiased bilinear filter (torchvision's
    default) instead of plain bilinear (``hasten.stream.fused_crop.resize_whole``).

    Position: ``set_epoch(e)`` as with DistributedSampler (iterating also advances
    it); ``state_dict()`` is ``{"epoch", "position"}``: the examples of that epoch
    already delivered in yielded batches. ``load_state_dict`` makes the next
    iteration deliver exactly the rest of that epoch (a later ``set_epoch`` with the
    same epoch keeps the position; another epoch starts from its beginning).
    """

    def __init__(self, shards, *, batch_size: int, image_size: int = 224, rank: int = 0, world_size: int = 1,
                 seed: int = 0, train: bool = True, shuffle: bool | None = None, shuffle_buffer: int = 1000,
                 drop_last: bool = False, workers: int = 0, chunk_size: int | None = None, prefetch: int = 2,
                 max_bad_fraction: float = 0.01, device: torch.device | str = "cpu", with_keys: bool = False,
                 poll_s: float = 0.2, antialias: bool = False):
        # One chunk per batch by default: a worker writes a whole batch, which the consumer
        # then takes without copying it again.
        chunk_size = batch_size if chunk_size is None else chunk_size
        for name, value, low in (("batch_size", batch_size, 1), ("image_size", image_size, 1),
                                 ("chunk_size", chunk_size, 1), ("prefetch", prefetch, 1), ("workers", workers, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        if not 0 <= max_bad_fraction <= 1:
            raise ValueError(f"max_bad_fraction must be in [0, 1]; got {max_bad_fraction!r}")
        epoch_plan([], epoch=0, rank=rank, world_size=world_size)  # validates rank and world_size
        self.shards = shards
        self.batch_size, self.image_size = batch_size, image_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.train = train
        self.shuffle = train if shuffle is None else shuffle
        self.buffer = check_buffer_size(shuffle_buffer) if self.shuffle else 0
        self.drop_last, self.workers, self.chunk_size, self.prefetch = drop_last, workers, chunk_size, prefetch
        self.max_bad_fraction, self.poll_s = max_bad_fraction, poll_s
        self.device = torch.device(device)
        self.with_keys = with_keys
        self.antialias = bool(antialias)
        self.skipped: list[tuple[str, str]] = []
        self.epoch, self.position = 0, 0

    @property
    def classes(self) -> list[str]:
        return list(getattr(self.shards, "classes", []))

    def examples_per_rank(self) -> int:
        """Examples this rank delivers per epoch (ranks differ by at most one)."""
        n = sum(self.shards.examples)
        return n * (self.rank + 1) // self.world_size - n * self.rank // self.world_size

    def __len__(self) -> int:
        n = self.examples_per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= self.examples_per_rank():
            raise ValueError(f"position {position} is outside this rank's epoch of {self.examples_per_rank()} "
                             "examples (was the checkpoint written with another world size or data set?)")
        self.epoch, self.position = epoch, position

    def plan(self, epoch: int) -> EpochPlan:
        return epoch_plan(self.shards.examples, epoch=epoch, seed=self.seed, rank=self.rank,
                          world_size=self.world_size, shuffle=self.shuffle, buffer=self.buffer)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch, position = self.epoch, self.position
        states: deque[int] = deque()  # each batch's position, in step with the batches
        batches = to_device(self._epoch(epoch, position, states), self.device, depth=2)
        return self._track(batches, states, epoch)

    def _track(self, batches, states: deque, epoch: int):
        # The position moves when the consumer receives a batch, not when it is made
        # (to_device prepares batches ahead on a GPU).
        for batch in batches:
            self.epoch, self.position = epoch, states.popleft()
            yield batch
        self.epoch, self.position = epoch + 1, 0

    def _epoch(self, epoch: int, position: int, states: deque) -> Iterator[tuple[torch.Tensor, ...]]:
        plan = self.plan(epoch)
        # Local shard files are scanned, not read: the decode workers read each image's bytes
        # themselves (scan_shard). From other stores (slow storage, a cache) the shards are
        # read whole and, with workers, each chunk's bytes copied once more into a reused
        # shared-memory buffer (PackedChunk). Records are copies out of their shard, not views
        # into it: a view would keep the whole shard in memory for as long as the shuffle
        # buffer holds any of its examples (measured: the resident set grew to the size of the
        # data set).
        records = plan_records(self.shards, plan, position, prefetch=self.prefetch, lazy=True)
        pool = BufferPool()
        in_flight = max(self.prefetch, 2 * self.workers)  # two chunks per worker keep every worker busy
        # Batches reused while the consumer lets go of them: the chunks in flight, those waiting
        # here and in to_device, and a few the consumer holds.
        batches = BatchPool((self.chunk_size, self.image_size, self.image_size, 3), cap=in_flight + 6)
        decoded = ordered_map(partial(decode_chunk, image_size=self.image_size, seed=self.seed, epoch=epoch,
                                      train=self.train, antialias=self.antialias),
                              map(partial(pack_chunk, pool=pool, batches=batches), _chunked(records, self.chunk_size))
                              if self.workers else _chunked(records, self.chunk_size), workers=self.workers,
                              prefetch=in_flight, poll_s=self.poll_s)
        seen, skipped = 0, []
        parts: list[DecodedChunk] = []
        held = 0
        try:
            for chunk in decoded:
                if self.workers:
                    pool.release_oldest()  # this chunk's worker is done with its input
                    out = batches.arrived(len(chunk.keys))
                    if chunk.images is None:  # the worker wrote the crops into our buffer
                        chunk.images = out
                    del out
                seen += len(chunk.keys) + len(chunk.bad)
                if chunk.bad:
                    skipped.extend(chunk.bad)
                    self.skipped.extend(chunk.bad)
                    check_bad_fraction(skipped, seen, self.max_bad_fraction, min_total=MIN_COUNTED)
                if len(chunk.keys):  # (a chunk of bad records only would cost the next batch a copy)
                    parts.append(chunk)
                held += len(chunk.keys)
                while held >= self.batch_size:
                    batch, parts, held = _take(parts, self.batch_size)
                    states.append(batch.end)
                    yield self._tensors(batch)
            if held and not self.drop_last:
                batch, parts, held = _take(parts, held)
                states.append(batch.end)
                yield self._tensors(batch)
        finally:
            decoded.close()
            if not self.workers:
                close_files()  # (workers' descriptors end with them)

    def _tensors(self, batch: DecodedChunk) -> tuple[torch.Tensor, ...]:
        # A (B, 3, S, S) view in channels_last memory format, as StreamLoader gives.
        out = (batch.images.permute(0, 3, 1, 2), torch.from_numpy(batch.labels))
        return out + (torch.from_numpy(batch.keys),) if self.with_keys else out


def _take(parts: list[DecodedChunk], n: int) -> tuple[DecodedChunk, list[DecodedChunk], int]:
    """The first ``n`` examples of the chunks, as one chunk; the rest; how many are left."""
    taken, rest, need = [], [], n
    for p in parts:
        if need == 0:
            rest.append(p)
        elif len(p.keys) <= need:
            taken.append(p)
            need -= len(p.keys)
        else:
            head = DecodedChunk(p.images[:need], p.labels[:need], p.keys[:need], p.places[:need],
                                int(p.places[need - 1]) + 1)
            tail = DecodedChunk(p.images[need:], p.labels[need:], p.keys[need:], p.places[need:], p.end)
            taken.append(head)
            rest.append(tail)
            need = 0
    if len(taken) == 1:  # a chunk of exactly one batch (the default chunk size): no copy
        return taken[0], rest, sum(len(p.keys) for p in rest)
    batch = DecodedChunk(torch.cat([p.images for p in taken]), np.concatenate([p.labels for p in taken]),
                         np.concatenate([p.keys for p in taken]), np.concatenate([p.places for p in taken]),
                         taken[-1].end)
    return batch, rest, sum(len(p.keys) for p in rest)
