"""The on-disk cache: downloads, decoded datasets and record stores.

Lives in ``$HASTEN_CACHE``, else ``~/.cache/hasten``. An entry's key is
``cache_key(source, options)``: the fingerprint of the input (sha256 of an
archive's bytes, so a copy elsewhere still hits; for a directory, its file
names, sizes and modification times) and the options that change the bytes or
pixels stored, and nothing else. Every entry is written to a temporary name
next to its final place and renamed into place, so a crash or a concurrent run
never leaves a half-written entry that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from hasten.data.archive import walk_error
from hasten.data.dataset import Source
from hasten.errors import DataError


def cache_dir() -> Path:
    """The cache root (created on first use)."""
    root = Path(os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the cache directory {str(root)!r} ({e}); set HASTEN_CACHE to a "
                        "writable directory") from None
    return root


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 22) -> str:
    """Hex digest of a file's bytes, read in chunks (archives can be large)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_fingerprint(root: str | os.PathLike) -> str:
    """sha256 over relative names, sizes and modification times of every file
    under ``root``: any added, removed, resized or touched file changes it."""
    root = Path(root)
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error, followlinks=True):
        dirnames.sort()
        rel = Path(dirpath).relative_to(root).as_posix()
        h.update(f"D {rel}\n".encode())
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"F {rel}/{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def source_fingerprint(source: Source) -> str:
    """What identifies the input's content: its bytes for an archive, its tree for a directory."""
    if source.container == "dir":
        return "dir:" + tree_fingerprint(source.path)
    return "file:" + file_digest(source.path, "sha256")


def cache_key(source: Source, options: dict) -> str:
    """The key of ``source`` read with ``options``: pass exactly the options that
    change what is stored (plus a format version), so that others share the entry."""
    blob = json.dumps({"input": source_fingerprint(source), "options": options}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def entry_dir(area: str, source: Source, options: dict, root: str | os.PathLike | None = None) -> Path:
    """``<root>/<area>/<source name>-<cache_key>``; ``root`` defaults to ``cache_dir()``."""
    root = Path(root) if root is not None else cache_dir()
    return root / area / f"{source.name}-{cache_key(source, options)}"


def save_entry(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write ``<name>.npy`` per array plus ``meta.json`` into directory ``path``,
    atomically: everything goes to a temporary sibling that is renamed at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arr), allow_pickle=False)
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "meta.json").exists():
                raise
            # Another run finished the same entry first; its content is identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_entry(path: Path, names: list[str], *, mmap: bool = False) -> tuple[dict[str, np.ndarray], dict] | None:
    """The arrays and meta of a complete entry, or None when there is none. An
    unreadable entry (a disk error, a file damaged after the fact) is deleted,
    so the caller's rebuild can take its place. ``mmap``: map the arrays
    read-only instead of reading them (processes forked later share the pages)."""
    if not (path / "meta.json").is_file():
        return None
    try:
        with open(path / "meta.json") as f:
            meta = json.load(f)
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
                  for name in names}
    except (OSError, ValueError, EOFError):
        shutil.rmtree(path, ignore_errors=True)
        return None
    return arrays, meta
