"""The streaming input pipeline, with optional data echoing.

For data that is not decoded once and held on the device:

    records (folder/archive cache, maybe slow storage) -> split over ranks per epoch
    -> decode in worker processes (simplejpeg, else Pillow) -> per-example crop/flip
    -> [echo] -> shuffle buffer -> batch -> [echo] -> pinned memory -> device

``StreamLoader`` composes the pieces, each usable alone: ``rank_indices``
(hasten.stream.rank_split), ``decode_stream`` (hasten.stream.decode_pool), ``keyed_crop_flip``
(hasten.data.host_augment), the echo stages and ``shuffle_buffer`` (hasten.echo),
``batch_examples`` and ``to_device`` (here). It is a plain iterable of
(images uint8 (B, 3, H, W), labels int64 (B,)) batches, or with ``mean`` and
``std`` of (inputs normalised on the device by ``hasten.data.normalize``, labels),
and also a ``torch.utils.data.IterableDataset``. Images come in channels_last
memory format, which convolutions accept as is. ``DataLoader(loader,
batch_size=None, num_workers=k)`` splits each rank's shard over the k loader workers.

Echo ``variant`` decides where the echo stage sits (Choi et al., 2019):
``example-before`` echoes decoded examples and augments every copy afresh on the
consumer side; ``example-after`` augments in the decode workers and echoes the
augmented examples; ``batch`` echoes whole batches.

Based on: Choi et al., "Faster Neural Network Training with Data Echoing" (2019);
Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" / "Image
Classification at Supercomputer Scale" (2018-19) for sharding, caching,
prefetching and fused decode.

Changes the training math: no, without echoing (the usual shuffled, augmented
epochs); yes with echoing (see hasten.echo.stages).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import repeat

import numpy as np
import torch

from hasten.data.host_augment import keyed_crop_flip
from hasten.data.normalize import normalize
from hasten.echo.auto import AutoEcho
from hasten.echo.counters import EchoCounters
from hasten.echo.stages import (
    auto_shuffle_buffer,
    check_buffer_size,
    check_factor,
    check_variant,
    default_shuffle_buffer,
    echo_batches,
    echo_examples,
    shuffle_buffer,
    warn_if_small_buffer,
)
from hasten.stream.decode_pool import decode_stream
from hasten.stream.rank_split import rank_indices


def batch_examples(
    examples: Iterable[tuple], batch_size: int, *, drop_last: bool = False, counters: EchoCounters | None = None,
) -> Iterator[tuple[np.ndarray, ...]]:
    """Group (image HWC, label, key, ...) tuples into (images NHWC, labels, keys, ...) arrays.

    Fields after the image become int64 arrays; ``key`` identifies the example (its
    dataset index) and feeds the within-batch duplicate count of ``counters``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    return _batched(examples, batch_size, drop_last, counters)


def _batched(examples, batch_size, drop_last, counters):
    group = []
    for example in examples:
        group.append(example)
        if len(group) == batch_size:
            yield _collate(group, counters)
            group = []
    if group and not drop_last:
        yield _collate(group, counters)


def _collate(group, counters):
    fields = list(zip(*group))
    if counters is not None:
        counters.record_batch(fields[2])
    return (np.stack(fields[0]), *(np.asarray(f, dtype=np.int64) for f in fields[1:]))


def _examples(chunks) -> Iterator[tuple[np.ndarray, int, int, int]]:
    for chunk in chunks:
        yield from zip(chunk.images, chunk.labels.tolist(), chunk.keys.tolist(), repeat(0))


def _number_copies(examples) -> Iterator[tuple[np.ndarray, int, int, int]]:
    """Number the echoed copies of each example (the echo stage repeats the same object)."""
    previous, copy = None, 0
    for example in examples:
        copy = copy + 1 if example is previous else 0
        previous = example
        yield example[:3] + (copy,)


def to_device(
    batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device | str, *, depth: int = 2
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Move tuples of CPU tensors to ``device``: pinned memory, non-blocking copies,
    ``depth`` batches in flight ahead of the consumer. On a CPU device, a no-op."""
    device = torch.device(device)
    if device.type == "cpu":
        yield from batches
        return
    for item in threaded(batches, lambda batch: tuple(t.pin_memory() for t in batch), depth=depth):
        yield tuple(t.to(device, non_blocking=True) for t in item)


def threaded(items: Iterable, prepare, *, depth: int = 2) -> Iterator:
    """``prepare(item)`` for each of ``items``, run with the iteration of ``items`` on a
    thread of its own, ``depth`` results ahead of the consumer (``to_device`` pins there)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def pin():
        # Pinning and the copy's setup run off the training thread, overlapping the step.
        try:
            for batch in items:
                item = prepare(batch)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            q.put(e)

    thread = threading.Thread(target=pin, daemon=True, name="hasten-pin")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class StreamLoader(torch.utils.data.IterableDataset):
    """Shuffled, sharded, augmented batches streamed from a record store.

    ``records``: ``records[i] -> (name, bytes, label)`` with ``len``; usually
    ``hasten.stream.records.open_records(path)``, possibly wrapped in ``SlowStorage``.
    ``echo``: a factor >= 1 or an ``AutoEcho``; ``variant``: where it applies.
    ``shuffle_buffer``: items (examples, or batches for batch echoing) mixed after
    echoing; by default (None) sized for example echoing by
    ``hasten.echo.default_shuffle_buffer(e, batch_size)`` so that about 1% of a batch
    are repeated copies (with ``AutoEcho`` it follows the current e), and 0 without
    echoing or for batch echoing (the indices are already shuffled per epoch). A
    given size too small for a fixed e warns. ``augment``: random crop (reflect pad 4) and flip. ``counters``
    accumulate over epochs. Call ``set_epoch(e)`` before each epoch, as with
    DistributedSampler (iterating also advances it by one). ``with_keys``: yield
    (images, labels, dataset indices) to trace examples. ``mean``, ``std`` (both
    or neither, per channel in 0..1 units, e.g. from ``channel_stats``): yield
    images normalised to ``dtype`` on ``device`` instead of uint8.
    """

    def __init__(
        self,
        records,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        workers: int = 0,
        chunk_size: int = 128,
        prefetch: int = 4,
        image_size: int | None = None,
        augment: bool = True,
        echo: float | AutoEcho = 1,
        variant: str = "example-before",
        shuffle_buffer: int | None = None,
        device: torch.device | str = "cpu",
        max_bad_fraction: float = 0.01,
        poll_s: float = 0.2,
        with_keys: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1; got {chunk_size!r}")
        rank_indices(len(records), rank=rank, world_size=world_size)  # validates rank and world_size
        self.records = records
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.workers, self.chunk_size, self.prefetch = workers, chunk_size, prefetch
        self.image_size, self.augment = image_size, augment
        self.echo = check_factor(echo)
        self.variant = check_variant(variant)
        self.buffer = self._buffer_size(shuffle_buffer)
        self.device = torch.device(device)
        self.max_bad_fraction, self.poll_s = max_bad_fraction, poll_s
        self.with_keys = with_keys
        if (mean is None) != (std is None):
            raise ValueError("mean and std go together: give both (normalised batches) or neither (uint8 batches)")
        # On the device once, not per batch: normalising then costs no host-to-device copy.
        self._norm = None if mean is None else (torch.tensor(mean, dtype=torch.float32, device=self.device),
                                                 torch.tensor(std, dtype=torch.float32, device=self.device), dtype)
        self.counters = EchoCounters()
        self.skipped: list[tuple[str, str]] = []
        self.epoch = 0

    def _buffer_size(self, size: int | None):
        """The shuffle buffer after echoing: an int, or a function of AutoEcho's current e."""
        example_echo = self.variant != "batch"
        if size is not None:
            size = check_buffer_size(size)
            if example_echo and not isinstance(self.echo, AutoEcho):
                warn_if_small_buffer(size, self.echo, self.batch_size, stacklevel=4)
            return size
        if not example_echo:
            return 0
        if isinstance(self.echo, AutoEcho):
            # Follows e: a buffer sized for e_max while e is still 1 would hold back
            # thousands of fresh examples before the first step.
            return auto_shuffle_buffer(self.echo, self.batch_size)
        return default_shuffle_buffer(self.echo, self.batch_size) if self.echo > 1 else 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's (and DataLoader worker's) dataset indices for ``epoch``."""
        idx = rank_indices(len(self.records), rank=self.rank, world_size=self.world_size, epoch=epoch,
                           seed=self.seed, shuffle=self.shuffle)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            idx = idx[info.id :: info.num_workers]
        return idx

    def __len__(self) -> int:
        """Batches per epoch without echoing (echoing adds about (e - 1) times as many)."""
        n = len(self.indices(self.epoch))
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        self.epoch += 1
        return self._epoch(epoch)

    def _epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self.indices(epoch)
        chunks = [idx[i : i + self.chunk_size] for i in range(0, len(idx), self.chunk_size)]
        echoing = isinstance(self.echo, AutoEcho) or self.echo != 1
        augment_late = self.augment and echoing and self.variant == "example-before"
        seed = (self.seed * 1_000_003 + epoch) * 1_000_003 + self.rank
        # Augmentation is a function of (seed, epoch, example, copy), not of where it runs, so
        # echoing with e = 1 (e.g. AutoEcho switched off) trains exactly as no echoing.
        aug_seed = self.seed * 1_000_003 + epoch
        # Processes cannot be started from inside a (daemonic) DataLoader worker.
        workers = 0 if torch.utils.data.get_worker_info() is not None else self.workers
        decoded = decode_stream(
            self.records, chunks, workers=workers, image_size=self.image_size,
            augment=partial(keyed_crop_flip, seed=aug_seed) if self.augment and not augment_late else None,
            prefetch=self.prefetch, max_bad_fraction=self.max_bad_fraction, poll_s=self.poll_s,
            on_bad=self.skipped.extend,
        )
        examples = _examples(decoded)
        if echoing and self.variant != "batch":
            examples = echo_examples(examples, self.echo, seed=self.seed, epoch=epoch, counters=self.counters)
            examples = _number_copies(examples)
        else:
            examples = _count_fresh(examples, self.counters)
        if self.variant != "batch" or not echoing:
            examples = shuffle_buffer(examples, self.buffer, seed=seed)
        batches = batch_examples(examples, self.batch_size, drop_last=self.drop_last, counters=self.counters)
        if augment_late:
            batches = _augment_batches(batches, aug_seed)
        if echoing and self.variant == "batch":
            batches = echo_batches(batches, self.echo, seed=self.seed, epoch=epoch, counters=self.counters)
            batches = shuffle_buffer(batches, self.buffer, seed=seed)
        batches = to_device(_as_tensors(batches, self.with_keys, self.counters), self.device, depth=2)
        if isinstance(self.echo, AutoEcho):
            # Here, on the training thread: before the pipeline may start on a thread of its own
            # (to_device on CUDA), and the one place that sees the training step's own time.
            self.echo.setup_distributed()
            batches = _reported(batches, self.echo, per_batch=self.variant == "batch")
        return batches if self._norm is None else _normalized(batches, *self._norm)


def _reported(batches, auto: AutoEcho, per_batch: bool):
    """Report each batch to ``auto`` from the consumer's side of the pipeline: the wait
    for it, the consumer's time until it asks for the next (less time in ``auto.paused()``),
    its items (``record_step``), and the items taken (``count``). On CUDA the pipeline,
    echo stage included, runs on the pinning thread, whose own time between items is
    pinning and queueing, not the training step (hasten.echo.auto)."""
    it = iter(batches)
    auto.expect_step_reports()  # windows before the first step wait for it (a filling buffer)
    try:
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            paused = auto.paused_s
            yield batch
            step = time.perf_counter() - t1 - (auto.paused_s - paused)
            items = 1 if per_batch else len(batch[1])
            auto.record_step(t1 - t0, max(step, 0.0), items)
            auto.count(items)
    finally:
        it.close()  # a consumer that stops early stops the pipeline's thread now, not at collection


def _count_fresh(examples, counters: EchoCounters):
    for example in examples:
        counters.fresh_examples += 1
        yield example


def _augment_batches(batches, seed: int):
    for images, labels, keys, copies in batches:
        yield keyed_crop_flip(images, keys, seed=seed, copies=copies), labels, keys, copies


def _normalized(batches, mean: torch.Tensor, std: torch.Tensor, dtype: torch.dtype):
    # After the copy: uint8 crosses the bus, four times fewer bytes than float32.
    for images, *rest in batches:
        yield normalize(images, mean, std, dtype, channels_last=True), *rest


def _as_tensors(batches, with_keys: bool, counters: EchoCounters) -> Iterator[tuple[torch.Tensor, ...]]:
    for images, labels, keys, _ in batches:
        counters.batches_emitted += 1
        # A (B, 3, H, W) view in channels_last memory format: no copy (a contiguous
        # NCHW copy of uint8 costs more than decoding on CPU); convolutions take it as is.
        batch = (torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels))
        yield batch + (torch.from_numpy(keys),) if with_keys else batch
