"""``ShardLoader``: batches of fused-decoded crops streamed from tar shards, per rank, resumable.

It composes the pieces of shard streaming: a store (``hasten.stream.shard_store``),
the epoch's plan and its records (``hasten.stream.epoch_plan``: every example to one
rank once per epoch; a mid-epoch position names exactly the examples still to come),
decode in the worker pool of ``hasten.data.workers`` (``hasten.stream.chunk_decode``:
a fused random-resized or centre crop for large images, the whole image with a padded
random crop for small ones) into reused shared batches (``hasten.stream.shared_buffers``),
and ``hasten.stream.device_copy.to_device``. Data echoing is a stage on its output
(``hasten.stream.echo_stage``).

Memory stays bounded whatever the size of the set: ``prefetch`` shards read
ahead, one shard's worth of examples waiting for their turn in the in-shard
shuffle, ``shuffle_buffer`` undecoded examples, and ``prefetch`` decoded chunks.
Shard files on local disk are not read by the loading process: it scans their tar
headers (``hasten.stream.tar_members.scan_shard``) and the decode workers read each
image's bytes where they decode it, so the examples in the buffers are a few dozen
bytes each. That holds for a ``ShardCache`` whose cap holds the whole split too (remote
shards are streamed into their cache files, then read there); shards from other stores
(``SlowStorage``, a smaller cache) are read whole.

Bad input: an undecodable image or a missing or unreadable label is skipped and
counted by name (``shard-000003.tar:00001234.jpg``), as in every hasten reader,
until more than ``max_bad_fraction`` were bad; a truncated or damaged shard
stops the stream with one ``DataError`` naming it.

Based on: the WebDataset format (Breuel et al., 2020); Kumar et al., "Scale
MLPerf-0.6 models on Google TPU-v3 Pods" (2019) for sharded, cached, prefetched input.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import partial

import numpy as np
import torch

from hasten.data.bad_files import check_bad_fraction
from hasten.data.workers import ordered_map
from hasten.stream.chunk_decode import UNAUGMENTED, DecodedChunk, check_crop, decode_chunk, pack_chunk
from hasten.stream.decode_pool import MIN_COUNTED
from hasten.stream.device_copy import to_device
from hasten.stream.epoch_plan import EpochPlan, epoch_plan, plan_records
from hasten.stream.shared_buffers import BatchPool, BufferPool
from hasten.echo.shuffle_buffer import check_buffer_size
from hasten.stream.tar_members import close_files


class ShardLoader:
    """Batches of decoded crops streamed from a store of shards, sharded over ranks.

    ``shards``: a store (``open_source(path)``, maybe behind ``SlowStorage`` and
    ``ShardCache``). ``train=True``: shuffled shards, examples and buffer, and by default
    the random-resized crop and flip; ``train=False``: file order, by default the centre
    crop. ``crop``: one of ``hasten.stream.chunk_decode.CROPS`` instead of that default
    (``pad-crop`` and ``whole`` for small images: the whole image at ``image_size``, with
    or without a reflect-padded random crop and flip). Yields (images
    uint8 (B, 3, S, S) in channels_last memory format, labels int64 (B,)), with
    ``with_keys`` also the global example numbers. ``prefetch``: shards read ahead
    (and decoded chunks in flight, at least two per worker); ``shuffle_buffer``:
    undecoded examples mixed per rank; with the shard size, these bound the memory.
    ``chunk_size``: examples a worker decodes per task (default: a batch).
    ``antialias``: resize crops with the antialiased bilinear filter (torchvision's
    default) instead of plain bilinear (``hasten.stream.fused_crop.resize_whole``).

    Position: ``set_epoch(e)`` as with DistributedSampler (iterating also advances
    it); ``state_dict()`` is ``{"epoch", "position"}``: the examples of that epoch
    already delivered in yielded batches. ``load_state_dict`` makes the next
    iteration deliver exactly the rest of that epoch (a later ``set_epoch`` with the
    same epoch keeps the position; another epoch starts from its beginning).
    """

    def __init__(self, shards, *, batch_size: int, image_size: int = 224, rank: int = 0, world_size: int = 1,
                 seed: int = 0, train: bool = True, shuffle: bool | None = None, shuffle_buffer: int = 1000,
                 drop_last: bool = False, workers: int = 0, chunk_size: int | None = None, prefetch: int = 2,
                 max_bad_fraction: float = 0.01, device: torch.device | str = "cpu", with_keys: bool = False,
                 poll_s: float = 0.2, antialias: bool = False, crop: str | None = None):
        # One chunk per batch by default: a worker writes a whole batch, which the consumer
        # then takes without copying it again.
        chunk_size = batch_size if chunk_size is None else chunk_size
        for name, value, low in (("batch_size", batch_size, 1), ("image_size", image_size, 1),
                                 ("chunk_size", chunk_size, 1), ("prefetch", prefetch, 1), ("workers", workers, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        if not 0 <= max_bad_fraction <= 1:
            raise ValueError(f"max_bad_fraction must be in [0, 1]; got {max_bad_fraction!r}")
        epoch_plan([], epoch=0, rank=rank, world_size=world_size)  # validates rank and world_size
        self.shards = shards
        self.batch_size, self.image_size = batch_size, image_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.train = train
        self.crop = check_crop(crop) if crop is not None else ("random-resized" if train else "center")
        self.shuffle = train if shuffle is None else shuffle
        self.buffer = check_buffer_size(shuffle_buffer) if self.shuffle else 0
        self.drop_last, self.workers, self.chunk_size, self.prefetch = drop_last, workers, chunk_size, prefetch
        self.max_bad_fraction, self.poll_s = max_bad_fraction, poll_s
        self.device = torch.device(device)
        self.with_keys = with_keys
        self.antialias = bool(antialias)
        self.skipped: list[tuple[str, str]] = []
        self.epoch, self.position = 0, 0

    @property
    def classes(self) -> list[str]:
        return list(getattr(self.shards, "classes", []))

    def examples_per_rank(self) -> int:
        """Examples this rank delivers per epoch (ranks differ by at most one)."""
        n = sum(self.shards.examples)
        return n * (self.rank + 1) // self.world_size - n * self.rank // self.world_size

    def __len__(self) -> int:
        n = self.examples_per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= self.examples_per_rank():
            raise ValueError(f"position {position} is outside this rank's epoch of {self.examples_per_rank()} "
                             "examples (was the checkpoint written with another world size or data set?)")
        self.epoch, self.position = epoch, position

    def plan(self, epoch: int) -> EpochPlan:
        return epoch_plan(self.shards.examples, epoch=epoch, seed=self.seed, rank=self.rank,
                          world_size=self.world_size, shuffle=self.shuffle, buffer=self.buffer)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch, position = self.epoch, self.position
        states: deque[int] = deque()  # each batch's position, in step with the batches
        batches = to_device(self._as_tensors(self._epoch(epoch, position, states, self.crop)), self.device,
                            depth=2)
        return self._track(batches, states, epoch)

    def host_batches(self, *, augment: bool = True) -> Iterator[DecodedChunk]:
        """This epoch's batches on the host, for a stage that works on them before the copy
        to the device (``hasten.stream.echo_stage``): ``DecodedChunk`` s with images (B, S, S, 3)
        uint8, labels and global example numbers (``keys``). ``augment=False``: the crop
        without its augmentation (``pad-crop`` decodes ``whole``), for a stage that augments
        after itself; a ValueError for a crop that has none (the fused random-resized crop).
        The position moves as the stage takes each batch."""
        crop = self.crop if augment else UNAUGMENTED.get(self.crop)
        if crop is None:
            raise ValueError(f"crop {self.crop!r} has no form without augmentation (it decodes only the region "
                             f"it crops); use crop='pad-crop' for a stage that augments after decoding")
        epoch, position = self.epoch, self.position
        states: deque[int] = deque()
        return self._track(self._epoch(epoch, position, states, crop), states, epoch)

    def _track(self, batches, states: deque, epoch: int):
        # The position moves when the consumer receives a batch, not when it is made
        # (to_device prepares batches ahead on a GPU).
        try:
            for batch in batches:
                self.epoch, self.position = epoch, states.popleft()
                yield batch
        finally:
            batches.close()  # a consumer that stops early stops the workers now, not at collection
        self.epoch, self.position = epoch + 1, 0

    def _epoch(self, epoch: int, position: int, states: deque, crop: str) -> Iterator[DecodedChunk]:
        plan = self.plan(epoch)
        # Local shard files are scanned, not read: the decode workers read each image's bytes
        # themselves (scan_shard). From other stores (slow storage, a cache) the shards are
        # read whole and, with workers, each chunk's bytes copied once more into a reused
        # shared-memory buffer (PackedChunk). Records are copies out of their shard, not views
        # into it: a view would keep the whole shard in memory for as long as the shuffle
        # buffer holds any of its examples (measured: the resident set grew to the size of the
        # data set).
        records = plan_records(self.shards, plan, position, prefetch=self.prefetch, lazy=True)
        pool = BufferPool()
        in_flight = max(self.prefetch, 2 * self.workers)  # two chunks per worker keep every worker busy
        # Batches reused while the consumer lets go of them: the chunks in flight, those waiting
        # here and in to_device, and a few the consumer holds.
        batches = BatchPool((self.chunk_size, self.image_size, self.image_size, 3), cap=in_flight + 6)
        decoded = ordered_map(partial(decode_chunk, image_size=self.image_size, seed=self.seed, epoch=epoch,
                                      crop=crop, antialias=self.antialias),
                              map(partial(pack_chunk, pool=pool, batches=batches), _chunked(records, self.chunk_size))
                              if self.workers else _chunked(records, self.chunk_size), workers=self.workers,
                              prefetch=in_flight, poll_s=self.poll_s)
        seen, skipped = 0, []
        parts: list[DecodedChunk] = []
        held = 0
        try:
            for chunk in decoded:
                if self.workers:
                    pool.release_oldest()  # this chunk's worker is done with its input
                    out = batches.arrived(len(chunk.keys))
                    if chunk.images is None:  # the worker wrote the crops into our buffer
                        chunk.images = out
                    del out
                seen += len(chunk.keys) + len(chunk.bad)
                if chunk.bad:
                    skipped.extend(chunk.bad)
                    self.skipped.extend(chunk.bad)
                    check_bad_fraction(skipped, seen, self.max_bad_fraction, min_total=MIN_COUNTED)
                if len(chunk.keys):  # (a chunk of bad records only would cost the next batch a copy)
                    parts.append(chunk)
                held += len(chunk.keys)
                while held >= self.batch_size:
                    batch, parts, held = _take(parts, self.batch_size)
                    states.append(batch.end)
                    yield batch
            if held and not self.drop_last:
                batch, parts, held = _take(parts, held)
                states.append(batch.end)
                yield batch
        finally:
            decoded.close()
            if not self.workers:
                close_files()  # (workers' descriptors end with them)

    def _as_tensors(self, batches: Iterator[DecodedChunk]) -> Iterator[tuple[torch.Tensor, ...]]:
        try:
            for batch in batches:
                yield self._tensors(batch)
        finally:
            batches.close()  # a consumer that stops early stops the workers now

    def _tensors(self, batch: DecodedChunk) -> tuple[torch.Tensor, ...]:
        # A (B, 3, S, S) view in channels_last memory format: no copy; convolutions take it as is.
        out = (batch.images.permute(0, 3, 1, 2), torch.from_numpy(batch.labels))
        return out + (torch.from_numpy(batch.keys),) if self.with_keys else out


def _take(parts: list[DecodedChunk], n: int) -> tuple[DecodedChunk, list[DecodedChunk], int]:
    """The first ``n`` examples of the chunks, as one chunk; the rest; how many are left."""
    taken, rest, need = [], [], n
    for p in parts:
        if need == 0:
            rest.append(p)
        elif len(p.keys) <= need:
            taken.append(p)
            need -= len(p.keys)
        else:
            head = DecodedChunk(p.images[:need], p.labels[:need], p.keys[:need], p.places[:need],
                                int(p.places[need - 1]) + 1)
            tail = DecodedChunk(p.images[need:], p.labels[need:], p.keys[need:], p.places[need:], p.end)
            taken.append(head)
            rest.append(tail)
            need = 0
    if len(taken) == 1:  # a chunk of exactly one batch (the default chunk size): no copy
        return taken[0], rest, sum(len(p.keys) for p in rest)
    batch = DecodedChunk(torch.cat([p.images for p in taken]), np.concatenate([p.labels for p in taken]),
                         np.concatenate([p.keys for p in taken]), np.concatenate([p.places for p in taken]),
                         taken[-1].end)
    return batch, rest, sum(len(p.keys) for p in rest)


def _chunked(items, size: int):
    group = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group
