"""A stream shuffled through a bounded buffer, as tf.data's ``shuffle``.

Serves the shard pipeline (``hasten.stream.epoch_plan`` mixes each rank's examples with
it, ``hasten.stream.echo_stage`` spreads echoed copies apart) and plain iterables
(``hasten.echo`` re-exports it beside ``echo_examples``). The buffer holds ``size`` items,
so memory is bounded whatever the stream's length; an item leaves it after a geometric
number of arrivals, ``size`` on average, which is what spreads apart the copies an echo
stage makes next to each other.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["check_buffer_size", "shuffle_buffer"]

T = TypeVar("T")


def check_buffer_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"shuffle buffer size must be an integer >= 0 (0 or 1 = no shuffling); got {size!r}")
    return size


def shuffle_buffer(items: Iterable[T], size: int | Callable[[], int], *, seed: int = 0) -> Iterator[T]:
    """Shuffle a stream through a buffer of ``size`` items (as tf.data's shuffle).

    Each incoming item replaces a uniformly chosen buffered one, which is
    yielded; the rest is flushed in random order at the end. Every item comes
    out exactly once. ``size`` 0 or 1 passes the stream through unchanged. After
    example echoing, size it with ``hasten.echo.default_shuffle_buffer(e, batch_size)``.

    ``size`` may be a function, read before each item: with ``AutoEcho`` pass
    ``hasten.echo.auto_shuffle_buffer(auto, batch_size)``, so the buffer grows with e (a buffer
    sized for ``e_max`` while e is still 1 would hold back thousands of fresh
    examples before the first step). A size that comes down hands the surplus out at
    once (``auto_shuffle_buffer`` never comes down: see there). While such a buffer grows
    it still hands out one item for every two it takes in: a buffer that gives out
    nothing until full stalls the consumer for the whole fill on every rise of e
    (in the echo sweep, AutoEcho idle 41-56% against 20-35% for a fixed factor). Half
    the arrivals keeps the consumer fed when e at least doubles, as the upstream then
    delivers e times the items; the buffer reaches its size after twice as many.
    """
    if callable(size):
        return _shuffled_dynamic(items, size, seed)
    if check_buffer_size(size) <= 1:
        return iter(items)
    return _shuffled(items, size, seed)


def _shuffled(items: Iterable[T], size: int, seed: int) -> Iterator[T]:
    rng = random.Random(seed)
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        out, buf[j] = buf[j], item
        yield out
    rng.shuffle(buf)
    yield from buf


def _shuffled_dynamic(items: Iterable[T], size: Callable[[], int], seed: int) -> Iterator[T]:
    rng = random.Random(seed)
    buf: list[T] = []
    growing = 0  # items taken in while below the size: every second one lets one out
    for item in items:
        k = check_buffer_size(size())
        while len(buf) > max(k, 1):  # the size came down: hand out the surplus
            j = rng.randrange(len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            yield buf.pop()
        if k <= 1 and not buf:
            yield item
        elif len(buf) < k:
            buf.append(item)
            growing += 1
            if growing % 2 == 0:
                j = rng.randrange(len(buf))
                buf[j], buf[-1] = buf[-1], buf[j]
                yield buf.pop()
        else:
            j = rng.randrange(len(buf))
            out, buf[j] = buf[j], item
            yield out
    rng.shuffle(buf)
    yield from buf
