"""One epoch's plan of a rank, on example numbers only, and the records it names.

Per epoch, ``epoch_plan`` orders the shards by a permutation of (seed, epoch),
the examples inside each shard by another, and cuts the resulting sequence into
``world_size`` contiguous ranges that differ by at most one example: every
example goes to exactly one rank once per epoch (as torch's DistributedSampler
without padding), and a rank reads its own shards plus at most two shared at the
ends of its range. A shuffle buffer (``hasten.echo.shuffle_buffer``) then mixes
each rank's stream. All of it
is computed on example numbers, from the counts, before any byte is read, so a
mid-epoch position (epoch, examples already delivered) names exactly the
examples still to come: ``plan_records`` reads only the shards that still hold
some of them, ``prefetch`` at a time, and hands them over in the plan's order.

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019) for
sharded, prefetched input.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hasten.errors import DataError
from hasten.stream.shard_store import ShardFiles
from hasten.echo.shuffle_buffer import shuffle_buffer
from hasten.stream.tar_members import Record, read_shard, scan_shard


@dataclass(frozen=True)
class EpochPlan:
    """Which examples a rank delivers in one epoch, in which order.

    The epoch's global sequence is ``shard_order`` with each shard's examples in
    its own permutation; this rank owns positions ``start`` to ``stop`` of it and
    delivers them in the order ``order`` (indices into its range, after the shuffle buffer).
    """

    shard_order: np.ndarray  # shard numbers in reading order
    shard_start: np.ndarray  # global position of each shard's first example (by shard number)
    start: int
    stop: int
    order: np.ndarray  # int64 (stop - start,)
    seed: int
    epoch: int
    shuffle: bool

    def __len__(self) -> int:
        return self.stop - self.start

    def member_order(self, shard: int, count: int) -> np.ndarray:
        """The permutation of one shard's examples this epoch (example i goes to place perm[i])."""
        if not self.shuffle:
            return np.arange(count)
        return np.random.default_rng([self.seed & 0xFFFFFFFF, self.epoch, shard + 1]).permutation(count)


def epoch_plan(counts: Sequence[int], *, epoch: int, seed: int = 0, rank: int = 0, world_size: int = 1,
               shuffle: bool = True, buffer: int = 0) -> EpochPlan:
    """The ``EpochPlan`` of one rank (see the module docstring); pure arithmetic on ``counts``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size - 1}]; got {rank!r}")
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    shard_order = (np.random.default_rng([seed & 0xFFFFFFFF, epoch]).permutation(len(counts)) if shuffle
                   else np.arange(len(counts)))
    shard_start = np.empty(len(counts), dtype=np.int64)
    shard_start[shard_order] = np.concatenate([[0], np.cumsum(counts[shard_order])[:-1]]) if len(counts) else []
    start, stop = n * rank // world_size, n * (rank + 1) // world_size
    size = stop - start
    if shuffle and buffer > 1:
        mixed = shuffle_buffer(range(size), buffer, seed=(seed * 1_000_003 + epoch) * 1_000_003 + rank)
        order = np.fromiter(mixed, dtype=np.int64, count=size)
    else:
        order = np.arange(size, dtype=np.int64)
    return EpochPlan(shard_order, shard_start, start, stop, order, seed, epoch, shuffle)


def plan_records(store, plan: EpochPlan, position: int = 0, *, prefetch: int = 2,
                 lazy: bool = False) -> Iterator[tuple[int, Record]]:
    """(place in the rank's order, ``Record``) from ``position`` on, reading from
    ``store`` only the shards that still hold examples due, ``prefetch`` at a time.

    ``lazy``: a shard the store hands over as a complete local file (``shard_file(i)``:
    ``ShardFiles``, and a ``ShardCache`` that keeps every shard, fetching it into the file
    first) is scanned, not read (``scan_shard``): the records carry where their images
    are (``Record.where``), for the decoder to read.
    A store whose class defines ``shard_records(i, lazy=)`` (a source of examples rather
    than of tar bytes: ``hasten.stream.virtual_shards``) hands over its records directly;
    a wrapper that only forwards attributes (``SlowStorage``, ``ShardCache``) does not
    define it on its class, so its reads still go through ``store[i]``."""
    counts = np.asarray(store.examples, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else np.zeros(0, np.int64)
    remaining = plan.order[position:]
    due = np.zeros(len(plan), dtype=bool)
    due[remaining] = True
    wanted = []
    for s in plan.shard_order.tolist():
        first, last = plan.shard_start[s] - plan.start, plan.shard_start[s] + counts[s] - plan.start
        lo, hi = max(first, 0), min(last, len(plan))
        if lo < hi and due[lo:hi].any():
            wanted.append(s)
    sizes = getattr(store, "sizes", None)
    pending: dict[int, Record] = {}
    t = position
    pool = ThreadPoolExecutor(max_workers=max(1, prefetch), thread_name_prefix="hasten-shard")
    # Local shard files are read into reused buffers (records are copied out when parsed);
    # other stores (slow or remote storage, caches) hand over new bytes.
    buffers: deque[bytearray] = deque()
    # Looked up on the class: an attribute forwarded by a wrapper's __getattr__ would skip the wrapper.
    direct = getattr(type(store), "shard_records", None)

    local_file = getattr(type(store), "shard_file", None)

    def read(s: int):
        if lazy and local_file is not None and hasattr(os, "pread"):  # (not on Windows)
            path = local_file(store, s)
            if path is not None:
                scanned = scan_shard(path, store.names[s], expected=int(counts[s]),
                                     size=sizes[s] if sizes is not None else None)
                if scanned is not None:
                    return None, None, scanned
        if direct is not None:
            records = direct(store, s, lazy=lazy)
            if len(records) != counts[s]:
                raise DataError(f"shard {store.names[s]} holds {len(records)} examples, the store says {counts[s]}")
            return None, None, records
        if isinstance(store, ShardFiles):
            try:
                buffer = buffers.popleft()  # (two reader threads may race for the last one)
            except IndexError:
                buffer = None
            return (*store.read_into(s, buffer), None)
        return None, store[s], None

    try:
        # Shards are read ``prefetch`` ahead: reads from slow storage overlap like concurrent requests.
        futures = [pool.submit(read, s) for s in wanted[:prefetch]]
        for i, s in enumerate(wanted):
            buffer, data, records = futures[i].result()
            futures[i] = None  # the shard's bytes are freed (or their buffer reused) once parsed
            if i + prefetch < len(wanted):
                futures.append(pool.submit(read, wanted[i + prefetch]))
            if records is None:
                records = read_shard(data, store.names[s], expected=int(counts[s]),
                                     size=sizes[s] if sizes is not None else None)
            if isinstance(data, memoryview):
                data.release()
            del data
            if buffer is not None:
                buffers.append(buffer)
            place = plan.member_order(s, len(records))
            for member, record in enumerate(records):
                j = int(plan.shard_start[s] + place[member] - plan.start)
                if 0 <= j < len(plan) and due[j]:
                    record.key = int(offsets[s]) + member
                    pending[j] = record
            while t < len(plan) and int(plan.order[t]) in pending:
                yield t, pending.pop(int(plan.order[t]))
                t += 1
    finally:
        # A consumer that stops early does not wait for reads nobody will use.
        pool.shutdown(wait=False, cancel_futures=True)
    if t != len(plan) or pending:
        raise DataError(f"internal: {len(plan) - t} examples of the epoch never read, {len(pending)} never due")
