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
(``link_bytes_per_s``) after any bytes queued before them, each request also
limited to ``bandwidth_bytes_per_s``; the record is returned when both are done.
All of it runs on a storage clock that stands still inside ``paused()``: an
evaluation pause lets no read, started or not, run ahead for free.

Changes the training math: no (timing only).
"""

from __future__ import annotations

import math
import threading
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


class SlowStorage:
    """``source[i]`` after the delay of one request (module docstring).

    ``latency_s``: per request. ``bandwidth_bytes_per_s``: per request (one
    connection). ``link_bytes_per_s``: shared by all concurrent requests.
    ``size_of(record)``: bytes a record costs on the wire; by default the total
    length of the bytes it holds (a bytes object, or a tuple containing some).
    Reads from several threads overlap, as concurrent requests to object storage do.
    ``reads`` and ``delay_s`` (summed per-request delays) count what was read.
    """

    def __init__(self, source: Any, *, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf,
                 link_bytes_per_s: float = math.inf, size_of: Callable[[Any], int] | None = None):
        if not (isinstance(latency_s, (int, float)) and math.isfinite(latency_s) and latency_s >= 0):
            raise ValueError(f"latency_s must be a finite number >= 0 (seconds per item); got {latency_s!r}")
        self.source = source
        self.latency_s = float(latency_s)
        self.bandwidth = _check_rate("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        self.link = _check_rate("link_bytes_per_s", link_bytes_per_s)
        self.size_of = size_of or _nbytes
        self._running = threading.Event()
        self._running.set()
        self._lock = threading.Lock()
        self._paused_total = 0.0  # storage clock = wall clock - time spent paused
        self._paused_since: float | None = None
        self._link_free_at = 0.0  # storage-clock time the shared link finishes its queued bytes
        self.reads = 0
        self.delay_s = 0.0

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):
        self._running.wait()
        record = self.source[i]
        self.wait_for(record)
        return record

    def clock(self) -> float:
        """Seconds on the storage clock, which does not advance inside ``paused()``."""
        with self._lock:
            now = time.perf_counter()
            paused = self._paused_total + (now - self._paused_since if self._paused_since is not None else 0.0)
            return now - paused

    def wait_for(self, record: Any) -> None:
        """Sleep as long as reading ``record`` from this storage would take."""
        nbytes = self.size_of(record) if (self.bandwidth != math.inf or self.link != math.inf) else 0
        start = self.clock()
        done = start + self.latency_s + (nbytes / self.bandwidth if self.bandwidth != math.inf else 0.0)
        if self.link != math.inf:
            with self._lock:
                # Bytes queue on the shared link in request order, after the latency.
                link_start = max(start + self.latency_s, self._link_free_at)
                self._link_free_at = link_start + nbytes / self.link
                done = max(done, self._link_free_at)
        with self._lock:
            self.reads += 1
            self.delay_s += done - start
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
        """Stop the storage clock inside this ``with`` block: no read starts or progresses."""
        with self._lock:
            nested = self._paused_since is not None
            if not nested:
                self._paused_since = time.perf_counter()
        self._running.clear()
        try:
            yield
        finally:
            if not nested:
                with self._lock:
                    self._paused_total += time.perf_counter() - self._paused_since
                    self._paused_since = None
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
