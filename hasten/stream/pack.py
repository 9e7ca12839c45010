"""``pack``: an image folder or archive to size-bounded tar shards plus an index.

The input is what every hasten reader takes (``hasten.data.sources``): a folder or
archive in the ``train/<class>/*``, ``test/<class>/*`` layout, parsed by
``hasten.data.layout`` so that labels are the same as ``load_dataset``'s. Each
split is written to ``OUTDIR/<split>/shard-NNNNNN.tar`` in the web-dataset layout
(``KEY.jpg`` or ``KEY.png`` with the file's bytes unchanged, ``KEY.cls`` with the
label), in a permutation of the split drawn from ``seed``: classes are mixed
across shards, so a reader that shuffles shards and examples within them (and a
buffer) sees mixed batches. A shard closes before it would exceed
``shard_bytes``. ``OUTDIR/index.json`` records per shard its example count,
size and SHA-256, the class names and the source; readers check shards against
it, and a cache of shards read from a URL is keyed by it (the same index is the
same data, wherever it is served from).

The output is deterministic: the same input, seed and shard size give the same
bytes (tar headers carry no times or owners). An archive is first extracted,
checked member by member, into a temporary folder inside ``OUTDIR`` (removed
afterwards): packing reads the files in the permuted order, and a compressed
archive can only be read front to back. Nothing is decoded; unreadable images
are copied as they are and skipped, by name, when read.

With ``max_side`` (``hasten data pack --max-side N``) each JPEG whose longer side
exceeds N is stored re-encoded with its longer side N (``hasten.stream.presize``,
FFCV's ``max_resolution``); smaller images keep their bytes. The index records
``max_side`` (null: images as given) and, when set, what was resized.

Changes the training math: no; with ``max_side``: yes (smaller stored images,
see ``hasten.stream.presize``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np

from hasten.data.archive import safe_extract, walk_error
from hasten.data.bad_files import describe_skipped
from hasten.data.layout import SPLITS, parse_layout
from hasten.data.sources import resolve_source
from hasten.decode.header import image_format
from hasten.errors import DataError
from hasten.progress import progress
from hasten.stream import presize as ps
from hasten.stream.shard_store import INDEX

log = logging.getLogger("hasten.stream")

FORMAT = 1
DEFAULT_SHARD_BYTES = 64 << 20  # 64 MiB: ~550 ImageNet JPEGs; memory per shard read ahead
_BLOCK = 512  # tar block: every member costs a header block plus its data rounded up


def _member_bytes(n: int) -> int:
    return _BLOCK + -(-n // _BLOCK) * _BLOCK


def list_files(root: Path) -> tuple[list[str], list[str]]:
    """(files, directories) under ``root`` as sorted relative POSIX paths, dot-files left out."""
    names, dirs = [], []
    for folder, subdirs, files in os.walk(root, onerror=walk_error):
        subdirs.sort()
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirs.extend(prefix + d for d in subdirs)
        names.extend(prefix + f for f in sorted(files) if not f.startswith("."))
    return names, dirs


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tf.addfile(info, io.BytesIO(data))


def pack(src: str | os.PathLike, outdir: str | os.PathLike, *, shard_bytes: int = DEFAULT_SHARD_BYTES,
         seed: int = 0, shuffle: bool = True, max_side: int | None = None,
         quality: int = ps.DEFAULT_QUALITY) -> dict:
    """Pack the image folder or archive ``src`` into shards under ``outdir`` (empty
    or new); returns the index that is also written to ``outdir/index.json``.
    ``max_side``: store JPEGs larger than that re-encoded at ``quality`` with their
    longer side ``max_side`` (``hasten.stream.presize``)."""
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 4 * _BLOCK:
        raise ValueError(f"shard_bytes must be an integer >= {4 * _BLOCK}; got {shard_bytes!r}")
    if max_side is not None:
        ps.check_max_side(max_side)
        ps.check_quality(quality)
    source = resolve_source(src)
    if source.kind != "image-folder":
        raise DataError(f"{str(source.path)!r} is CIFAR-10 in its binary format, not image files; pack reads "
                        "image folders (train/<class>/<file>) and archives of them")
    out = Path(outdir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"output {str(out)!r} exists and is not an empty directory; choose a new one")
    # A failed or interrupted pack leaves nothing behind: the directories it made, or
    # the contents of the empty one it was given.
    made = next((d for d in reversed([out, *out.parents]) if not d.exists()), None)
    out.mkdir(parents=True, exist_ok=True)
    unpacked, done = None, False
    try:
        root = source.path
        if source.container != "dir":
            unpacked = out / ".unpacking"
            log.info("extracting %s to read it in shuffled order", source.path)
            root = safe_extract(source.path, unpacked)
        index = _pack_tree(root, out, shard_bytes=shard_bytes, seed=seed, shuffle=shuffle, where=str(source.path),
                           max_side=max_side, quality=quality)
        index["source"] = source.path.name
        tmp = out / f".{INDEX}.tmp"
        tmp.write_text(json.dumps(index, indent=1) + "\n")
        os.replace(tmp, out / INDEX)
        done = True
    finally:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        if not done:
            _remove_output(out, made)
    return index


def _remove_output(out: Path, made: Path | None) -> None:
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _pack_tree(root: Path, out: Path, *, shard_bytes: int, seed: int, shuffle: bool, where: str,
               max_side: int | None, quality: int) -> dict:
    names, dirs = list_files(root)
    layout = parse_layout(names, dirs, source=where)
    if layout.stray:
        log.warning("%s: %d file(s) outside any class folder left out: %s", where, len(layout.stray),
                    describe_skipped(layout.stray))
    index = {"format": FORMAT, "classes": layout.classes, "seed": seed, "shuffled": shuffle,
             "shard_bytes": shard_bytes, "splits": {}, "left_out": [n for n, _ in layout.stray],
             "max_side": max_side}
    if max_side is not None:
        # kept: images larger than max_side stored as they are, with the reason (a PNG, an unreadable file).
        sized = {"quality": quality, "encoder": ps.encoder(), "filter": "lanczos", "resized": 0, "bytes_in": 0,
                 "bytes_out": 0, "kept": []}
        index["presize"] = sized
    for split in SPLITS:
        files = layout.splits[split]
        order = (np.random.default_rng(seed).permutation(len(files.indices)) if shuffle
                 else np.arange(len(files.indices)))
        (out / split).mkdir(exist_ok=True)
        shards: list[dict] = []
        writer, used, count = None, 0, 0

        def close():
            writer.close()
            path = out / split / f"shard-{len(shards):06d}.tar"
            os.replace(path.with_suffix(".tar.tmp"), path)
            shards.append({"name": f"{split}/{path.name}", "examples": count, "bytes": path.stat().st_size,
                           "sha256": _sha256(path)})

        with progress(total=len(order), desc=f"packing {split}", unit="file") as bar:
            for key, k in enumerate(order.tolist()):
                i, label = files.indices[k], files.labels[k]
                data = (root / names[i]).read_bytes()
                if max_side is not None:
                    sized["bytes_in"] += len(data)
                    result = ps.presize(data, names[i], max_side, quality)
                    data = result.data
                    sized["resized"] += result.resized
                    sized["bytes_out"] += len(data)
                    if result.kept_because:
                        sized["kept"].append([names[i], result.kept_because])
                suffix = "png" if image_format(data) == "png" else "jpg"
                cls = str(label).encode()
                size = _member_bytes(len(data)) + _member_bytes(len(cls))
                # 2 end blocks; a shard holds at least one example, however large.
                if writer is not None and used + size + 2 * _BLOCK > shard_bytes:
                    close()
                    writer = None
                if writer is None:
                    tmp = out / split / f"shard-{len(shards):06d}.tar.tmp"
                    writer, used, count = tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT), 0, 0
                _add(writer, f"{key:08d}.{suffix}", data)
                _add(writer, f"{key:08d}.cls", cls)
                used += size
                count += 1
                bar.update()
        if writer is not None:
            close()
        index["splits"][split] = {"examples": len(order), "shards": shards}
    if max_side is not None and sized["kept"]:
        log.warning("%s: %d image(s) larger than --max-side %d stored as they are: %s", where, len(sized["kept"]),
                    max_side, describe_skipped(sized["kept"]))
    return index


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
