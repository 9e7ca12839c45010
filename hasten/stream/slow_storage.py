"""Slow storage on demand: per-request latency, concurrent requests and a bandwidth cap.

Reading training data over a network from object storage is slow per request
(latency), allows many requests at once (parallel reads hide the latency), and is
limited in bytes per second by the link they all share. ``SlowStorage`` imposes
these on any indexable source of records (``source[i]``), ``concurrent_reads``
issues several requests at once and hands the records back in order, and
``slow_iter`` slows down any iterable, so an input bottleneck (R = upstream time /
downstream time of 2 to 8, as in Choi et al., 2019, section 4) can be produced and
studied on one machine. The delay is a sleep, like waiting on the network: it
takes no CPU from the training step.

Timing model of one request for a record of ``n`` bytes started at time t:
the latency ends at t + ``latency_s``; its bytes then cross the shared link
(``link_bytes_per_s``, plus ``item_s`` per record) after any queued before them,
each request also limited to ``bandwidth_bytes_per_s``; the record is returned
when both are done. ``item_s`` alone makes a storage that delivers one record
per ``item_s`` seconds however many readers ask at once (a throughput, where
``latency_s`` is hidden by concurrent requests). A request that carries several
items (a shard of examples: ``items_of``) costs ``item_s`` per item. All of it runs on a storage
clock that stands still inside ``paused()``: an evaluation pause lets no read,
started or not, run ahead for free.

One storage, many processes: its state (the storage clock and its pauses, the
shared link's queue, the counters) lives in shared memory, so decode worker
processes forked (or spawned) from the process that made it read through the
same storage: their reads queue on one link, stop when the parent pauses, and
count in the parent's ``reads``, ``delay_s`` and ``link_busy_s``. The storage
clock is ``time.monotonic``, one clock for every process of the machine.

Changes the training math: no (timing only).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def _nbytes(record: Any) -> int:
    if isinstance(record, (bytes, bytearray, memoryview)):
        return len(record)
    if isinstance(record, tuple):
        return sum(_nbytes(x) for x in record)
    return 0


def _check_rate(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be > 0 (math.inf = unlimited); got {value!r}")
    return float(value)


# Slots of the shared state (doubles).
_PAUSED_TOTAL, _PAUSED_SINCE, _LINK_FREE_AT, _DELAY, _LINK_BUSY = range(5)


class SlowStorage:
    """``source[i]`` after the delay of one request (module docstring).

    ``latency_s``: per request. ``bandwidth_bytes_per_s``: per request (one
    connection). ``link_bytes_per_s``: shared by all concurrent requests, and
    ``item_s``: link seconds per record on top (``item_s`` alone: a storage that
    serves 1 / ``item_s`` records per second to all its readers together).
    ``size_of(record)``: bytes a record costs on the wire; by default the total
    length of the bytes it holds (a bytes object, or a tuple containing some).
    ``items_of(i)``: items record i holds (default 1), each costing ``item_s``: for a
    store of shards, ``store.examples.__getitem__``, so that ``item_s`` is the time per example.
    Reads from several threads or processes overlap, as concurrent requests to
    object storage do. ``reads``, ``delay_s`` (summed per-request delays, queueing
    included), ``items`` (the items those records held) and ``link_busy_s`` (seconds the
    shared link carried records) count
    what was read, in every process. ``mp_context``: the start method the readers'
    processes use (default: fork on Linux, else spawn), whose shared memory holds the state.
    """

    def __init__(self, source: Any, *, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf,
                 link_bytes_per_s: float = math.inf, item_s: float = 0.0,
                 size_of: Callable[[Any], int] | None = None, items_of: Callable[[int], int] | None = None,
                 mp_context: str | None = None):
        if not (isinstance(latency_s, (int, float)) and math.isfinite(latency_s) and latency_s >= 0):
            raise ValueError(f"latency_s must be a finite number >= 0 (seconds per item); got {latency_s!r}")
        if not (isinstance(item_s, (int, float)) and math.isfinite(item_s) and item_s >= 0):
            raise ValueError(f"item_s must be a finite number >= 0 (link seconds per record); got {item_s!r}")
        self.source = source
        self.latency_s = float(latency_s)
        self.item_s = float(item_s)
        self.bandwidth = _check_rate("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        self.link = _check_rate("link_bytes_per_s", link_bytes_per_s)
        self.size_of = size_of or _nbytes
        self.items_of = items_of
        ctx = mp.get_context(mp_context or ("fork" if sys.platform == "linux" else "spawn"))
        # Shared memory: forked or spawned readers see and change the same clock, link and counters.
        self._lock = ctx.Lock()
        self._running = ctx.Event()
        self._running.set()
        self._state = ctx.RawArray("d", 5)  # storage clock = wall clock - time spent paused
        self._state[_PAUSED_SINCE] = math.nan
        self._reads = ctx.RawValue("q", 0)
        self._items = ctx.RawValue("q", 0)

    @property
    def reads(self) -> int:
        """Records read, by every process."""
        return self._reads.value

    @property
    def items(self) -> int:
        """Items the records read held (``items_of``; one per record without it), by every process."""
        return self._items.value

    @property
    def delay_s(self) -> float:
        """Summed per-request delays (latency, transfer and queueing), by every process."""
        return self._state[_DELAY]

    @property
    def link_busy_s(self) -> float:
        """Seconds the shared link spent on records (``item_s`` each plus their bytes), by every process."""
        return self._state[_LINK_BUSY]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):
        self._running.wait()
        record = self.source[i]
        self.wait_for(record, items=1 if self.items_of is None else int(self.items_of(i)))
        return record

    def _clock(self) -> float:  # the lock held
        now = time.monotonic()
        since = self._state[_PAUSED_SINCE]
        return now - self._state[_PAUSED_TOTAL] - (0.0 if math.isnan(since) else now - since)

    def clock(self) -> float:
        """Seconds on the storage clock, which does not advance inside ``paused()``."""
        with self._lock:
            return self._clock()

    def wait_for(self, record: Any, items: int = 1) -> None:
        """Sleep as long as reading ``record`` (of ``items`` items) from this storage would take."""
        nbytes = self.size_of(record) if (self.bandwidth != math.inf or self.link != math.inf) else 0
        with self._lock:
            start = self._clock()
            # The delay as a duration, not as a difference of clock readings: those are hours
            # of uptime, and (start + d) - start loses about 1e-11 s each time.
            delay = self.latency_s + (nbytes / self.bandwidth if self.bandwidth != math.inf else 0.0)
            on_link = (nbytes / self.link if self.link != math.inf else 0.0) + self.item_s * items
            if on_link:
                # Records queue on the shared link in request order, after the latency.
                link_start = max(start + self.latency_s, self._state[_LINK_FREE_AT])
                self._state[_LINK_FREE_AT] = link_start + on_link
                self._state[_LINK_BUSY] += on_link
                delay = max(delay, self._state[_LINK_FREE_AT] - start)
            done = start + delay
            self._reads.value += 1
            self._items.value += items
            self._state[_DELAY] += delay
        while True:
            self._running.wait()
            remaining = done - self.clock()
            if remaining <= 0:
                return
            # A pause that begins during this sleep moves ``done`` later on the wall clock:
            # the loop wakes, waits out the pause, and sleeps the rest.
            time.sleep(remaining)

    def __getattr__(self, name: str):
        # Attributes of the wrapped store (labels, names, ...) stay reachable.
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    @contextmanager
    def paused(self):
        """Stop the storage clock inside this ``with`` block: no read starts or progresses,
        in this process or any reader process."""
        with self._lock:
            nested = not math.isnan(self._state[_PAUSED_SINCE])
            if not nested:
                self._state[_PAUSED_SINCE] = time.monotonic()
                self._running.clear()
        try:
            yield
        finally:
            if not nested:
                with self._lock:
                    self._state[_PAUSED_TOTAL] += time.monotonic() - self._state[_PAUSED_SINCE]
                    self._state[_PAUSED_SINCE] = math.nan
                    self._running.set()


def concurrent_reads(storage, keys: Iterable, *, in_flight: int = 1, prefetch: int = 0) -> Iterator:
    """``storage[k]`` for each of ``keys``, in order, with up to ``in_flight`` requests at
    once and up to ``prefetch`` finished records held ahead of the consumer.

    Parallel requests hide per-request latency (the link's bandwidth still caps the
    rate); ``in_flight = 1, prefetch = 0`` reads one record at a time on demand.
    """
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight must be an integer >= 1 (concurrent requests); got {in_flight!r}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an integer >= 0 (records read ahead); got {prefetch!r}")
    return _concurrent(storage, iter(keys), in_flight, prefetch)


def _concurrent(storage, keys: Iterator, in_flight: int, prefetch: int) -> Iterator:
    window = in_flight + prefetch  # requests issued and not yet handed to the consumer
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="hasten-read") as pool:
        try:
            for key in keys:
                pending.append(pool.submit(storage.__getitem__, key))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def slow_iter(items: Iterable[T], *, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf) -> Iterator[T]:
    """Yield ``items`` as if each were read from slow storage (see ``SlowStorage``)."""
    storage = SlowStorage(None, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s)
    return _slowed(items, storage)


def _slowed(items: Iterable[T], storage: SlowStorage) -> Iterator[T]:
    for item in items:
        storage.wait_for(item)
        yield item
