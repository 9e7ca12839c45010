"""Read and extract directories and archives (.tar, .tar.gz, .tar.xz, .tar.bz2, .zip) safely.

Compressed tars are decompressed in a background thread while the caller parses
them, so reading uses two cores where it has them.
Every archive member is checked before use: absolute names, ``..`` components,
symbolic and hard links, device files and FIFOs are refused with a ``DataError``
naming the member (the tar "path traversal" family, CVE-2007-4559 and relatives).
``safe_extract`` checks the whole archive before it writes a single byte and
writes regular files itself rather than trusting ``extractall``. Unreadable or
truncated archives become one ``DataError`` too, never a decompressor traceback.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import queue
import re
import stat
import tarfile
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

from hasten.errors import DataError

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
ZIP_SUFFIXES = (".zip",)
ARCHIVE_SUFFIXES = TAR_SUFFIXES + ZIP_SUFFIXES

# What a damaged archive raises from inside tarfile/zipfile and the decompressors.
_READ_ERRORS = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
                OSError, RuntimeError, NotImplementedError, UnicodeDecodeError)

_DRIVE = re.compile(r"^[A-Za-z]:")


def archive_kind(path: str | os.PathLike) -> str | None:
    """"dir", "tar", "zip", or None for anything else."""
    path = Path(path)
    if path.is_dir():
        return "dir"
    name = path.name.lower()
    if name.endswith(ZIP_SUFFIXES):
        return "zip"
    if name.endswith(TAR_SUFFIXES):
        return "tar"
    return None


def archive_stem(path: str | os.PathLike) -> str:
    """The name without its archive suffix: ``cifar10-jpeg.tar.xz`` -> ``cifar10-jpeg``."""
    name = Path(path).name
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _clean_name(raw: str, archive: Path) -> str:
    """The member's relative POSIX name, or a DataError if it could escape."""
    name = raw.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    if name.startswith("/") or _DRIVE.match(name) or "\x00" in name:
        raise DataError(f"archive {archive.name} has a member with an absolute path: {raw!r}; refusing to read it")
    if ".." in name.split("/"):
        raise DataError(f"archive {archive.name} has a member that escapes its directory: {raw!r}; refusing to read it")
    name = name.rstrip("/")
    return "" if name == "." else name  # "." is the archive's root (tar -C DIR .): nothing to make


def _check_tar_member(member: tarfile.TarInfo, archive: Path) -> str:
    name = _clean_name(member.name, archive)
    if member.issym() or member.islnk():
        raise DataError(f"archive {archive.name} has a link member {member.name!r} -> {member.linkname!r}; "
                        "links are refused")
    if not (member.isreg() or member.isdir()):
        raise DataError(f"archive {archive.name} has a device, FIFO or special member {member.name!r}; "
                        "only regular files and directories are accepted")
    return name


def _check_zip_member(info: zipfile.ZipInfo, archive: Path) -> str:
    name = _clean_name(info.filename, archive)
    # Unix zips keep st_mode in the high 16 bits; a file type of 0 means "not recorded".
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise DataError(f"archive {archive.name} has a symbolic-link member {info.filename!r}; links are refused")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise DataError(f"archive {archive.name} has a device, FIFO or special member {info.filename!r}; "
                        "only regular files and directories are accepted")
    return name


def iter_entries(path: str | os.PathLike, container: str | None = None) -> Iterator[tuple[str, bytes | None]]:
    """Yield ``(relative name, bytes)`` for every regular file and ``(name, None)``
    for every directory of a directory tree or an archive, in storage order.

    ``container``: what ``archive_kind`` says of ``path``, when the caller knows
    it already (a ``Source`` does). Archives are read as a stream (one pass, even
    for .tar.xz). A directory is the user's own tree, so symbolic links in it are
    followed.
    """
    path = Path(path)
    kind = container or archive_kind(path)
    if kind == "dir":
        yield from _iter_dir(path)
        return
    if kind is None:
        raise DataError(f"{str(path)!r} is neither a directory nor an archive; accepted archives: "
                        + ", ".join(ARCHIVE_SUFFIXES))
    try:
        if kind == "tar":
            with _open_decompressed(path) as raw, tarfile.open(fileobj=raw, mode="r|") as tf:
                for member in tf:
                    name = _check_tar_member(member, path)
                    if not name:
                        continue
                    if member.isdir():
                        yield name, None
                    else:
                        yield name, tf.extractfile(member).read()
        else:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    name = _check_zip_member(info, path)
                    if not name:
                        continue
                    yield (name, None) if info.is_dir() else (name, zf.read(info))
    except DataError:
        raise
    except _READ_ERRORS as e:
        raise DataError(f"cannot read archive {str(path)!r}: {_why_unreadable(path, e)}") from None


def _why_unreadable(path: Path, exc: BaseException) -> str:
    """One short reason an archive could not be read (tarfile's own message for a
    file it cannot open lists every decompressor it tried, each with its error)."""
    try:
        if path.stat().st_size == 0:
            return "the file is empty (0 bytes)"
    except OSError:
        pass
    text = str(exc)
    if isinstance(exc, tarfile.ReadError) and "could not be opened successfully" in text:
        return "not a tar archive, plain or gzip/bzip2/xz-compressed (truncated, corrupt or another format?)"
    text = " ".join(text.split())
    return f"{type(exc).__name__}: {text[:200]} (truncated, corrupt or not the format its name says)"


# Magic bytes of the compressions a .tar may come in, and how to undo each.
_COMPRESSIONS = ((b"\xfd7zXZ\x00", lzma.open), (b"\x1f\x8b", gzip.open), (b"BZh", bz2.open))


def _open_decompressed(path: Path) -> io.RawIOBase:
    """The uncompressed bytes of a (possibly compressed) tar file, decompressed
    ahead in a background thread: lzma, zlib and bz2 release the GIL, so the
    caller's tar parsing runs on one core while decompression runs on another."""
    with open(path, "rb") as f:
        magic = f.read(6)
    for prefix, opener in _COMPRESSIONS:
        if magic.startswith(prefix):
            return ReadAhead(opener(path))
    return open(path, "rb", buffering=0)


class ReadAhead(io.RawIOBase):
    """A read-only stream over ``raw`` whose blocks a background thread reads
    ahead (at most ``depth`` blocks). Errors in the thread surface on read;
    ``close`` stops the thread and closes ``raw``."""

    def __init__(self, raw, block: int = 1 << 20, depth: int = 8):
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._buf, self._pos, self._eof = b"", 0, False
        self._thread = threading.Thread(target=self._fill, args=(raw, block), daemon=True)
        self._thread.start()

    def _fill(self, raw, block: int) -> None:
        try:
            with raw:
                while not self._stop.is_set():
                    data = raw.read(block)
                    self._put(data)
                    if not data:
                        return
        except Exception as e:  # noqa: BLE001 - handed to the reading thread, which raises it
            self._put(e)

    def _put(self, item) -> None:
        # Time out now and then so that close() can stop a thread whose reader went away.
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                pass

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._buf):
            if self._eof:
                return 0
            item = self._queue.get()
            if isinstance(item, Exception):
                raise item
            if not item:
                self._eof = True
                return 0
            self._buf, self._pos = item, 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        super().close()


def walk_error(e: OSError) -> None:
    """``os.walk`` skips directories it cannot list unless told otherwise; a
    skipped class folder would be silent data loss."""
    raise DataError(f"cannot list directory {e.filename!r}: {e.strerror}")


def _iter_dir(root: Path) -> Iterator[tuple[str, bytes | None]]:
    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error, followlinks=True):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        if prefix:
            yield prefix.rstrip("/"), None
        for name in sorted(filenames):
            file = os.path.join(dirpath, name)
            try:
                # Reading a FIFO or a device would block or never end.
                if not stat.S_ISREG(os.stat(file).st_mode):
                    raise DataError(f"{file!r} is a device, FIFO or socket, not a regular file")
                data = Path(file).read_bytes()
            except OSError as e:
                raise DataError(f"cannot read {file!r}: {e.strerror}") from None
            yield prefix + name, data


def iter_files(path: str | os.PathLike, container: str | None = None) -> Iterator[tuple[str, bytes]]:
    """``iter_entries`` without the directories."""
    for name, data in iter_entries(path, container):
        if data is not None:
            yield name, data


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Extract ``archive`` into ``dest`` after checking every member; nothing is
    written when any member is refused. Returns ``dest``."""
    archive, dest = Path(archive), Path(dest)
    kind = archive_kind(archive)
    if kind not in ("tar", "zip"):
        raise DataError(f"{str(archive)!r} is not an archive; accepted: " + ", ".join(ARCHIVE_SUFFIXES))
    try:
        if kind == "tar":
            with tarfile.open(archive, "r:*") as tf:
                members = [(_check_tar_member(m, archive), m) for m in tf.getmembers()]
                _write_members(dest, [(n, m.isdir(), lambda m=m: tf.extractfile(m).read()) for n, m in members])
        else:
            with zipfile.ZipFile(archive) as zf:
                members = [(_check_zip_member(i, archive), i) for i in zf.infolist()]
                _write_members(dest, [(n, i.is_dir(), lambda i=i: zf.read(i)) for n, i in members])
    except DataError:
        raise
    except _READ_ERRORS as e:
        raise DataError(f"cannot extract archive {str(archive)!r}: {_why_unreadable(archive, e)}") from None
    return dest


def _write_members(dest: Path, members) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    for name, is_dir, read in members:
        if not name:
            continue
        target = (root / name).resolve()
        # Names were checked already; this also catches a directory on disk
        # that is itself a link pointing elsewhere.
        if root not in target.parents:
            raise DataError(f"member {name!r} would land outside {str(dest)!r}; refusing to extract it")
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read())
