"""Slow storage on demand: per-item latency and a bandwidth limit.

Reading training data over a network from object storage is slow per request
and limited in bytes per second. ``SlowStorage`` imposes both on any indexable
source of records (``source[i]``), and ``slow_iter`` on any iterable, so an input
bottleneck (R = upstream time / downstream time of 2 to 8, as in Choi et al.,
2019, section 4) can be produced and studied on one machine. The delay is a
sleep, like waiting on the network: it takes no CPU from the training step.

``paused()`` holds readers back (e.g. during evaluation, so that an evaluation
pause does not let the slow source run ahead for free).

Changes the training math: no (timing only).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def _nbytes(record: Any) -> int:
    if isinstance(record, (bytes, bytearray, memoryview)):
        return len(record)
    if isinstance(record, tuple):
        return sum(_nbytes(x) for x in record)
    return 0


class SlowStorage:
    """``source[i]`` after ``latency_s`` seconds plus ``size / bandwidth`` seconds.

    The size of a record is the total length of the bytes it holds (a bytes
    object, or a tuple containing some). Reads from several threads overlap, as
    concurrent requests to object storage do.
    """

    def __init__(self, source: Any, *, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf):
        if not (isinstance(latency_s, (int, float)) and math.isfinite(latency_s) and latency_s >= 0):
            raise ValueError(f"latency_s must be a finite number >= 0 (seconds per item); got {latency_s!r}")
        if not (isinstance(bandwidth_bytes_per_s, (int, float)) and bandwidth_bytes_per_s > 0):
            raise ValueError(f"bandwidth_bytes_per_s must be > 0 (math.inf = unlimited); got {bandwidth_bytes_per_s!r}")
        self.source = source
        self.latency_s = float(latency_s)
        self.bandwidth = float(bandwidth_bytes_per_s)
        self._running = threading.Event()
        self._running.set()
        self.reads = 0
        self.delay_s = 0.0

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):
        self._running.wait()
        record = self.source[i]
        self.wait_for(record)
        return record

    def wait_for(self, record: Any) -> None:
        """Sleep as long as reading ``record`` from this storage would take."""
        delay = self.latency_s
        if self.bandwidth != math.inf:
            delay += _nbytes(record) / self.bandwidth
        self.reads += 1
        self.delay_s += delay
        if delay > 0:
            time.sleep(delay)

    def __getattr__(self, name: str):
        # Attributes of the wrapped store (labels, names, ...) stay reachable.
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    @contextmanager
    def paused(self):
        """Block new reads inside this ``with`` block."""
        self._running.clear()
        try:
            yield
        finally:
            self._running.set()


def slow_iter(items: Iterable[T], *, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf) -> Iterator[T]:
    """Yield ``items`` as if each were read from slow storage (see ``SlowStorage``)."""
    storage = SlowStorage(None, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s)
    return _slowed(items, storage)


def _slowed(items: Iterable[T], storage: SlowStorage) -> Iterator[T]:
    for item in items:
        storage.wait_for(item)
        yield item
