"""An image folder or the record blob as a store of shards: streaming without packing.

``ShardLoader`` reads any store of shards (``hasten.stream.shard_store``). A source with
random access to each example needs no tar files to be one: ``FolderShards`` (an image
folder in the ``train/<class>/*`` layout, ImageNet's) and ``RecordShards`` (the record
blob of ``hasten.stream.records``, which also serves archives: one sequential pass reads
them into it) cut the split into *virtual shards* of ``per_shard`` examples, drawn in a
permutation of ``seed`` as ``hasten data pack`` draws its shards, so classes mix across
shards. The loader's plan, exactly-once per epoch, mid-epoch resume, region decode in the
workers and reused shared batches then apply unchanged.

A virtual shard is read without tar bytes (``shard_records``): a folder's image stays in
its file and a blob's in the blob, each named by (file, offset, size, identity) in
``Record.where`` for the decode worker to read, as ``scan_shard`` leaves the images of a
local shard file; the loading process stats each file, it does not read it. Wrapped
in ``SlowStorage`` or ``ShardCache``, which move shards as bytes, ``store[i]`` builds the
shard's tar in memory, with the same member names and labels.

Labels come from ``hasten.data.layout``, as for ``load_dataset`` and ``hasten data pack``.
Bad input: a file that cannot be read, or that no longer is the file listed, is skipped and
counted by name (``train/group-000003:train/ant/ant01.jpg``) where it is decoded, like
an undecodable image; files outside any class folder are left out with one warning, as
``pack`` leaves them out.

Based on: torchvision's ``ImageFolder`` layout; the shard plan of ``hasten.stream.epoch_plan``.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path

import numpy as np

from hasten.data.bad_files import describe_skipped
from hasten.data.layout import SPLITS, parse_layout
from hasten.errors import DataError
from hasten.stream.pack import list_files
from hasten.stream.tar_members import IMAGE_SUFFIXES, Record

log = logging.getLogger("hasten.stream")

DEFAULT_PER_SHARD = 256  # examples per virtual shard: the unit read ahead (prefetch) and shuffled


class VirtualShards:
    """Examples ``0..n-1`` of a random-access source, cut into shards in a seeded order.

    Subclasses say how to reach example ``j``: ``_name(j)`` (its path in the source),
    ``_label(j)``, ``_where(j)`` ((file, offset, size, identity) of its bytes) and
    ``_bytes(j)``. The store interface: ``len``, ``names``, ``examples``, ``sizes``
    (None: a virtual shard has no size until its tar is built), ``classes``,
    ``store[i] -> bytes`` and ``shard_records(i, lazy=)``.
    """

    def __init__(self, count: int, *, split: str, classes: list[str], per_shard: int, seed: int):
        if isinstance(per_shard, bool) or not isinstance(per_shard, int) or per_shard < 1:
            raise ValueError(f"per_shard must be an integer >= 1 (examples per virtual shard); got {per_shard!r}")
        order = np.random.default_rng(seed).permutation(count)
        self._groups = [order[i:i + per_shard] for i in range(0, count, per_shard)]
        self.names = [f"{split}/group-{i:06d}" for i in range(len(self._groups))]
        self.examples = [len(g) for g in self._groups]
        self.sizes = [None] * len(self._groups)
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def total(self) -> int:
        return sum(self.examples)

    def _key(self, j: int) -> tuple[str, str]:
        """(tar member key, image suffix) of example j in shard i: the source's own path
        without its suffix, dots made underscores (a web-dataset key ends at the first dot)."""
        name = self._name(j)
        stem, dot, suffix = name.rpartition(".")
        if not dot or "/" in suffix:
            stem, suffix = name, ""
        suffix = suffix.lower() if suffix.lower() in IMAGE_SUFFIXES else "jpg"  # decoders read the bytes, not this
        folder, _, base = stem.rpartition("/")
        base = base.replace(".", "_")
        return (f"{folder}/{base}" if folder else base), suffix

    def shard_records(self, i: int, *, lazy: bool = False) -> list[Record]:
        """The examples of shard i (``key`` counts from 0), named ``SHARD:KEY.SUFFIX``;
        ``lazy``: the bytes left where they are (``Record.where``), else read here."""
        out = []
        for k, j in enumerate(self._groups[i].tolist()):
            key, suffix = self._key(j)
            name, label = f"{self.names[i]}:{key}.{suffix}", self._label(j)
            try:
                if lazy and hasattr(os, "pread"):
                    out.append(Record(k, name, None, label, where=self._where(j)))
                else:
                    out.append(Record(k, name, self._bytes(j), label))
            except OSError as e:
                out.append(Record(k, name, None, label, f"cannot read its bytes ({e.strerror or e})"))
        return out

    def __getitem__(self, i: int) -> bytes:
        """Shard i as the bytes of a tar in the web-dataset layout, for wrappers that move
        shards as bytes; read back by ``read_shard``, the same names, labels and bytes (an
        unreadable file becomes an example without an image, skipped by name)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            for r in self.shard_records(i):
                key = r.name.partition(":")[2].rpartition(".")[0]
                members = [(f"{key}.cls", str(r.label).encode())]
                if r.reason is None:
                    members.insert(0, (f"{key}.{r.name.rpartition('.')[2]}", r.data))
                for member, data in members:
                    info = tarfile.TarInfo(member)
                    info.size, info.mode = len(data), 0o644
                    tf.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


class FolderShards(VirtualShards):
    """The ``split`` of an image folder (``train/<class>/*``, ``test/<class>/*``) as a store
    of virtual shards of ``per_shard`` examples, in the order drawn from ``seed``."""

    def __init__(self, root: str | os.PathLike, split: str = "train", *, per_shard: int = DEFAULT_PER_SHARD,
                 seed: int = 0):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; accepted: {', '.join(SPLITS)}")
        self.root = Path(root).expanduser().resolve()  # workers may not share this process's working directory
        if not self.root.is_dir():
            raise DataError(f"image folder {str(root)!r} does not exist or is not a directory")
        names, dirs = list_files(self.root)
        layout = parse_layout(names, dirs, source=str(root))
        if layout.stray:
            log.warning("%s: %d file(s) outside any class folder left out: %s", root, len(layout.stray),
                        describe_skipped(layout.stray))
        files = layout.splits[split]
        self._files = [names[i] for i in files.indices]
        self._labels = list(files.labels)
        super().__init__(len(self._files), split=split, classes=layout.classes, per_shard=per_shard, seed=seed)

    def _name(self, j: int) -> str:
        return self._files[j]

    def _label(self, j: int) -> int:
        return self._labels[j]

    def _where(self, j: int) -> tuple[str, int, int, tuple[int, int, int]]:
        path = str(self.root / self._files[j])
        st = os.stat(path)
        return path, 0, st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns)

    def _bytes(self, j: int) -> bytes:
        return (self.root / self._files[j]).read_bytes()


class RecordShards(VirtualShards):
    """``hasten.stream.records.ByteRecords`` (one split of the record blob) as a store of
    virtual shards. A blob mapped from its file is read by the decode workers at its
    offsets; one in memory is copied out here."""

    def __init__(self, records, *, split: str = "train", per_shard: int = DEFAULT_PER_SHARD, seed: int = 0):
        self.records = records
        blob = records.blob
        file = getattr(blob, "filename", None)
        self._file = None
        if isinstance(blob, np.memmap) and file is not None:
            st = os.stat(file)
            # The .npy header precedes the data: the map's own offset says where it starts.
            self._file = (str(Path(file).resolve()), int(blob.offset), (st.st_dev, st.st_ino, st.st_mtime_ns))
        super().__init__(len(records), split=split, classes=records.classes, per_shard=per_shard, seed=seed)

    def _name(self, j: int) -> str:
        return self.records.names[j]

    def _label(self, j: int) -> int:
        return int(self.records.labels[j])

    def _where(self, j: int) -> tuple[str, int, int, tuple[int, int, int]]:
        start, stop = int(self.records.offsets[j]), int(self.records.offsets[j + 1])
        if self._file is None:
            raise OSError("the blob is not mapped from a file")
        path, base, ident = self._file
        return path, base + start, stop - start, ident

    def _bytes(self, j: int) -> bytes:
        return self.records[j][1]

    def shard_records(self, i: int, *, lazy: bool = False) -> list[Record]:
        return super().shard_records(i, lazy=lazy and self._file is not None)
