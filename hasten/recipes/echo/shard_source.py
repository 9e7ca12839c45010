"""A real upstream for the echo runs: fresh examples read from tar shards in a store
(a URL: over a real, emulated link) by the streaming pipeline's own loader, decoded as
they arrive.

The modelled runs (``hasten.recipes.echo.clock``) take their fresh examples from host
memory and add the waits a slow upstream would cause. Here nothing is modelled: the
examples come from ``hasten.stream.shard_loader.ShardLoader`` (its epoch plan: a shuffled
shard order, each shard's examples in a permutation, a shuffle buffer; its reads
``prefetch`` shards ahead from the store, ``RemoteShards`` over HTTP or S3 with no local
cache, so every epoch crosses the link, as when the data set does not fit on the host;
its decode, crop ``whole``: ``decode_fitted``, the decode that made the in-memory set, so
the pixels are the same). Each decoded chunk is written into the slots of its training
indices, where the training loop reads it. A fresh key names (epoch, index) as in
``hasten.recipes.echo.data.fresh_keys``, so the echo stage, shuffle buffer and keyed
augmentation downstream are the modelled runs' own.

Read-ahead: a thread runs the loader at most ``ahead`` examples before the consumer, and
the loader reads at most ``prefetch`` shards before that; so while the loop evaluates,
the link delivers at most that much more (the modelled source stops its clock instead).

Changes the training math: no (where the fresh examples come from, not what they are).
"""

from __future__ import annotations

from collections.abc import Iterator

import queue
import threading

import numpy as np

from hasten.errors import DataError
from hasten.stream.shard_loader import ShardLoader


class ShardSource:
    """Fresh training keys from ``store``'s shards, each image decoded into ``images``.

    ``store``: a shard store (``open_shards(path_or_url)`` or ``RemoteShards``).
    ``index_of``: the training index of each of the store's examples (its global
    example number); ``labels``: the training labels, checked against the shards' own.
    ``image_size``: the decoded size. ``buffer``: the plan's shuffle buffer (examples);
    ``prefetch``: shards read ahead; ``ahead``: decoded examples held for the consumer;
    ``chunk``: examples decoded per task; ``workers``: the loader's decode processes
    (0: decoded on the reading thread). An undecodable image is skipped and counted
    (``skipped``), up to the loader's ``max_bad_fraction``."""

    def __init__(self, store, index_of: np.ndarray, labels: np.ndarray, image_size: int, *,
                 buffer: int = 512, prefetch: int = 4, ahead: int = 512, chunk: int = 32, workers: int = 0,
                 max_bad_fraction: float = 0.01) -> None:
        n = int(sum(store.examples))
        index_of = np.asarray(index_of, dtype=np.int64)
        if len(index_of) != n or len(labels) != n:
            raise DataError(f"the store holds {n} examples; the training set has {len(labels)} "
                            f"and the index map {len(index_of)}")
        if not np.array_equal(np.sort(index_of), np.arange(n)):
            raise DataError("the index map is not a permutation of the training set")
        self.store, self.index_of, self.labels = store, index_of, np.asarray(labels)
        self.image_size, self.buffer, self.prefetch, self.ahead = image_size, buffer, prefetch, ahead
        self.chunk, self.workers, self.max_bad_fraction = chunk, workers, max_bad_fraction
        self.images = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
        self.arrived = 0  # images decoded so far, every epoch
        self.skipped: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self.images)

    def loader(self, seed: int) -> ShardLoader:
        """The streaming loader this source reads through: the training plan (shuffled shards,
        examples and buffer), the whole image at ``image_size``, no augmentation."""
        return ShardLoader(self.store, batch_size=self.chunk, image_size=self.image_size, seed=seed, train=True,
                           shuffle_buffer=self.buffer, prefetch=self.prefetch, workers=self.workers,
                           crop="whole", with_keys=True, max_bad_fraction=self.max_bad_fraction)

    def keys(self, seed: int) -> Iterator[int]:
        """Keys ``epoch * N + index`` of fresh examples, epoch after epoch, as they arrive.

        A thread runs the loader, at most ``ahead`` examples before the consumer (and
        ``prefetch`` shards before that): the next epoch's reads start while the consumer
        still takes the last of this one's, as a repeated tf.data pipeline's do."""
        out: queue.Queue = queue.Queue(maxsize=max(1, self.ahead // self.chunk))
        stop = threading.Event()
        loader = self.loader(seed)
        self.skipped = loader.skipped  # (the loader's own list: counted as it skips)
        thread = threading.Thread(target=self._read, args=(loader, out, stop), name="hasten-shard-source",
                                  daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if isinstance(item, BaseException):
                    raise item
                yield from item.tolist()
        finally:
            stop.set()
            while thread.is_alive():  # (unblocks a reader waiting on a full queue)
                try:
                    out.get_nowait()
                except queue.Empty:
                    thread.join(0.05)

    def _read(self, loader: ShardLoader, out: queue.Queue, stop: threading.Event) -> None:
        n = len(self.images)
        try:
            while not stop.is_set():
                epoch = loader.epoch
                chunks = loader.host_batches(augment=False)  # (the loader moves to the next epoch after)
                try:
                    for chunk in chunks:
                        if stop.is_set():
                            return
                        out.put(epoch * n + self._place(chunk))
                finally:
                    chunks.close()
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            out.put(e)

    def _place(self, chunk) -> np.ndarray:
        """The chunk's images written into their training slots; their training indices."""
        idx = self.index_of[chunk.keys]
        wrong = np.flatnonzero(chunk.labels != self.labels[idx])
        if len(wrong):
            j = int(wrong[0])
            raise DataError(f"example {int(chunk.keys[j])} of the shards: label {int(chunk.labels[j])} in the "
                            f"shard, {int(self.labels[idx[j]])} in the training set (shards packed from another "
                            "data set or order?)")
        self.images[idx] = chunk.images.numpy()
        self.arrived += len(idx)
        return idx
