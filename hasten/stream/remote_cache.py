"""The local cache in front of a remote shard store: ``open_remote_shards(URL)``, what
``open_shards(URL)`` returns, and the cache's directory (``hasten.stream.remote_store``'s
docstring says how the two work together).

Changes the training math: no.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from hasten.stream.remote_store import RemoteShards
from hasten.stream.retry import RetryPolicy
from hasten.stream.store_url import StoreURL


def remote_cache_dir(store: RemoteShards) -> Path:
    """``$HASTEN_CACHE/remote/<name>-<digest>/<split>``. An index that gives every shard's
    SHA-256 (``hasten data pack`` writes them) names the data whatever serves it: the digest
    is the index's alone, so the same set at a new address (a server on a new port, a
    mirror) reads the cache, and a changed set has a new index, so never the old set's
    shards. An index without checksums names the data only at its URL: the digest is of
    the URL and the index."""
    from hasten.data.cache import cache_dir

    checked = bool(store.checksums) and all(store.checksums)
    key = store.index_bytes if checked else str(store.url).encode() + b"\0" + store.index_bytes
    digest = hashlib.sha256(key).hexdigest()[:12]
    name = str(store.source or "shards") if checked else f"{store.url.bucket}/{store.url.prefix}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:60]
    return cache_dir() / "remote" / f"{slug}-{digest}" / store.split


def open_remote_shards(url: str | StoreURL, split: str = "train", *, retry: RetryPolicy | None = None,
                       cache_dir: str | os.PathLike | None = None, cache_bytes: int | None = None, **options):
    """``RemoteShards`` behind a local ``ShardCache`` (module docstring). ``cache_dir``: the
    cache's directory (default ``remote_cache_dir``); ``cache_bytes``: its cap (default: the
    whole split, or half the disk's free space when that is less). ``options``: ``RemoteShards``'s."""
    from hasten.stream.shard_cache import ShardCache

    store = RemoteShards(url, split, retry=retry, **options)
    directory = Path(cache_dir).expanduser() if cache_dir is not None else remote_cache_dir(store)
    cache = ShardCache(store, directory, max_bytes=0 if cache_bytes is None else cache_bytes)
    if cache_bytes is None:
        # Half the free space at most: checkpoints and other runs need the disk too.
        cache.max_bytes = min(sum(store.sizes), shutil.disk_usage(directory).free // 2)
    return cache
