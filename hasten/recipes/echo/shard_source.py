"""A real upstream for the echo runs: fresh examples read from tar shards in a store
(a URL: over a real, emulated link), decoded as they arrive, in an epoch plan.

The modelled runs (``hasten.recipes.echo.clock``) take their fresh examples from host
memory and add the waits a slow upstream would cause. Here nothing is modelled: each
epoch is the streaming pipeline's plan (``hasten.stream.epoch_plan``: a shuffled shard
order, each shard's examples in a permutation, a shuffle buffer), the shards are read
``prefetch`` ahead from the store (``RemoteShards`` over HTTP or S3, no local cache:
every epoch crosses the link, as when the data set does not fit on the host), and each
image is decoded from the bytes that arrived (``decode_fitted``, the decode that made
the in-memory set, so the pixels are the same) into the slot of its training index,
where the training loop reads it. A fresh key names (epoch, index) as in
``hasten.recipes.echo.data.fresh_keys``, so the echo stage, shuffle buffer and keyed
augmentation downstream are the modelled runs' own.

Read-ahead: a thread reads and decodes at most ``ahead`` examples before the consumer,
and the plan's reads go at most ``prefetch`` shards before that; so while the loop
evaluates, the link delivers at most that much more (the modelled source stops its
clock instead).

Changes the training math: no (where the fresh examples come from, not what they are).
"""

from __future__ import annotations

from collections.abc import Iterator

import queue
import threading

import numpy as np

from hasten.data.decode import BadImageError, decode_fitted
from hasten.errors import DataError
from hasten.stream.epoch_plan import epoch_plan, plan_records


class ShardSource:
    """Fresh training keys from ``store``'s shards, each image decoded into ``images``.

    ``store``: a shard store (``open_shards(path_or_url)`` or ``RemoteShards``).
    ``index_of``: the training index of each of the store's examples (its global
    example number); ``labels``: the training labels, checked against the shards' own.
    ``image_size``: the decoded size. ``buffer``: the plan's shuffle buffer (examples);
    ``prefetch``: shards read ahead; ``ahead``: decoded examples held for the consumer."""

    def __init__(self, store, index_of: np.ndarray, labels: np.ndarray, image_size: int, *,
                 buffer: int = 512, prefetch: int = 4, ahead: int = 512) -> None:
        n = int(sum(store.examples))
        index_of = np.asarray(index_of, dtype=np.int64)
        if len(index_of) != n or len(labels) != n:
            raise DataError(f"the store holds {n} examples; the training set has {len(labels)} "
                            f"and the index map {len(index_of)}")
        if not np.array_equal(np.sort(index_of), np.arange(n)):
            raise DataError("the index map is not a permutation of the training set")
        self.store, self.index_of, self.labels = store, index_of, np.asarray(labels)
        self.image_size, self.buffer, self.prefetch, self.ahead = image_size, buffer, prefetch, ahead
        self.images = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
        self.arrived = 0  # images decoded so far, every epoch
        self.skipped: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self.images)

    def keys(self, seed: int) -> Iterator[int]:
        """Keys ``epoch * N + index`` of fresh examples, epoch after epoch, as they arrive.

        A thread reads and decodes, at most ``ahead`` examples before the consumer (and
        ``prefetch`` shards before that): the next epoch's reads start while the consumer
        still takes the last of this one's, as a repeated tf.data pipeline's do."""
        out: queue.Queue = queue.Queue(maxsize=self.ahead)
        stop = threading.Event()
        thread = threading.Thread(target=self._read, args=(seed, out, stop), name="hasten-shard-source", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # (unblocks a reader waiting on a full queue)
                try:
                    out.get_nowait()
                except queue.Empty:
                    thread.join(0.05)

    def _read(self, seed: int, out: queue.Queue, stop: threading.Event) -> None:
        n = len(self.images)
        epoch = 0
        try:
            while not stop.is_set():
                plan = epoch_plan(self.store.examples, epoch=epoch, seed=seed, shuffle=True, buffer=self.buffer)
                records = plan_records(self.store, plan, prefetch=self.prefetch)
                try:
                    for _, record in records:
                        if stop.is_set():
                            return
                        key = self._decode(record)
                        if key is not None:
                            out.put(epoch * n + key)
                finally:
                    records.close()
                epoch += 1
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            out.put(e)

    def _decode(self, record) -> int | None:
        i = int(self.index_of[record.key])
        if record.reason is not None:
            self.skipped.append((record.name, record.reason))
            return None
        if record.label != self.labels[i]:
            raise DataError(f"{record.name}: label {record.label} in the shard, {self.labels[i]} in the "
                            "training set (shards packed from another data set or order?)")
        try:
            self.images[i] = decode_fitted(record.data, record.name, self.image_size)
        except BadImageError as e:
            self.skipped.append((record.name, str(e)))
            return None
        self.arrived += 1
        return i
