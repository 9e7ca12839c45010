"""``open_source(path, split)``: whatever a path holds, as one store of shards for ``ShardLoader``.

- a directory of tar shards (``index.json`` or ``shard-*.tar``: ``hasten data pack``'s
  output), a list of shard paths, or the URL of packed shards (``s3://``, ``https://``):
  ``hasten.stream.shard_store.open_shards``;
- an image folder (``train/<class>/*``): ``hasten.stream.virtual_shards.FolderShards``,
  each image read from its own file where it is decoded;
- an archive of one (.tar, .tar.gz, .tar.xz, .zip): read once, front to back, into the
  record blob (``hasten.stream.records.open_records``, cached), then
  ``hasten.stream.virtual_shards.RecordShards``.

Every store has the interface of ``hasten.stream.shard_store``, so ``ShardLoader`` gives
each the same plan (exactly once per epoch over the ranks, mid-epoch resume), the same
fused decode + random-resized crop and the same bad-input handling.

Changes the training math: no.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from hasten.data.sources import resolve_source
from hasten.errors import DataError
from hasten.stream.records import open_records
from hasten.stream.shard_store import is_shard_dir, open_shards
from hasten.stream.store_url import is_url
from hasten.stream.virtual_shards import DEFAULT_PER_SHARD, FolderShards, RecordShards


def open_source(path: str | os.PathLike | Sequence[str | os.PathLike], split: str = "train", *,
                per_shard: int = DEFAULT_PER_SHARD, seed: int = 0, retry=None):
    """The store of ``split`` at ``path`` (see the module docstring). ``per_shard`` and
    ``seed``: the size and order of the virtual shards of a folder or archive (packed
    shards keep theirs); ``retry``: a URL's (``open_shards``)."""
    if not isinstance(path, (str, os.PathLike)) or is_url(path) or is_shard_dir(path):
        return open_shards(path, split, retry=retry)
    source = resolve_source(path)
    if source.kind != "image-folder":
        raise DataError(f"{str(source.path)!r} is CIFAR-10 in its binary format, not image files; the streaming "
                        "pipeline reads image folders (train/<class>/<file>), archives of them and tar shards")
    if source.container == "dir":
        return FolderShards(source.path, split, per_shard=per_shard, seed=seed)
    return RecordShards(open_records(source, split), split=split, per_shard=per_shard, seed=seed)
