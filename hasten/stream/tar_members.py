"""Reading one tar shard in the web-dataset layout: its examples as ``Record`` objects.

A shard is a plain tar file, ``shard-000123.tar``, holding each example as
consecutive members with one key: ``KEY.jpg`` (or .jpeg, .png) and ``KEY.cls``
(the label as decimal text) or ``KEY.json`` (``{"label": 3}``).

``read_shard`` parses a shard's bytes; ``scan_shard`` reads only the tar headers and
labels of a local shard file and leaves each image where it is (``Record.where``), for
the decode worker to read with ``read_member``; ``count_examples`` counts a shard's
examples from its headers. Plain ustar/GNU headers are walked directly (tarfile's
per-member objects cost about as much as a small decode); tar extensions (pax headers,
long names) are left to the standard library.

Bad input: an example without an image, or with a missing or unreadable label, is a
``Record`` with ``reason`` set (the loader skips and counts it by name,
``shard-000003.tar:00001234.jpg``); a truncated or damaged shard raises one
``DataError`` naming it.

Based on: the WebDataset format (Breuel et al., 2020).

Changes the training math: no.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hasten.errors import DataError

IMAGE_SUFFIXES = ("jpg", "jpeg", "png")
LABEL_SUFFIXES = ("cls", "json")


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


def with_bytes(r: Record) -> Record:
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
