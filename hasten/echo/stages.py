"""Data echoing stages: repeat prepared data to keep the accelerator busy.

Based on: Choi, Passos, Shallue, Dahl, "Faster Neural Network Training with Data
Echoing" (2019, arXiv:1907.05550). When upstream (read, decode, augment) is
slower than a training step, an echo stage after the bottleneck hands each item
on e times, so the accelerator trains on repeated data instead of waiting.
Where the stage sits gives the paper's variants:

- ``example-before``: echo examples before augmentation; every copy gets its
  own random augmentation (the paper's best variant);
- ``example-after``: echo augmented examples; the copies are identical;
- ``batch``: echo whole batches after batching.

A shuffle buffer after an example-echo stage spreads the copies apart, so fewer
land in the same batch.

A non-integral factor e means floor(e) copies plus one more with probability
e - floor(e). That draw is a hash of (seed, epoch, fresh-item index), never of
the rank or of a process-local RNG, so every data-parallel rank draws the same
copy counts, takes the same number of steps, and collectives cannot deadlock.

Changes the training math: yes. Echoed data is repeated data: each step sees
fewer fresh examples, so more steps may be needed to reach a target; the paper
finds the wall-clock time to the target drops while e <= R.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar, Union

from hasten.echo.auto import AutoEcho
from hasten.echo.counters import EchoCounters

T = TypeVar("T")
Factor = Union[float, int, AutoEcho]

VARIANTS = ("example-before", "example-after", "batch")

_MASK = (1 << 64) - 1


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown echo variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    return variant


def check_factor(factor: Factor) -> Factor:
    """Accept an ``AutoEcho`` or a finite number >= 1; raise ValueError otherwise."""
    if isinstance(factor, AutoEcho):
        return factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
        raise ValueError(
            f"echo factor must be a number >= 1 (1 = no echoing, 2.5 = 2 or 3 copies) or AutoEcho ('auto' on the command line); got {factor!r}"
        )
    return factor


def check_buffer_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"shuffle buffer size must be an integer >= 0 (0 or 1 = no shuffling); got {size!r}")
    return size


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def echo_copies(factor: float, *, seed: int, epoch: int, index: int) -> int:
    """Copies of fresh item ``index``: floor(e), plus one with probability e - floor(e).

    A pure function of its arguments (a counter-based hash), so all ranks agree.
    """
    whole = math.floor(factor)
    frac = factor - whole
    if frac == 0:
        return whole
    u = _splitmix64(_splitmix64(_splitmix64(seed & _MASK) ^ (epoch & _MASK)) ^ (index & _MASK)) / 2.0**64
    return whole + (1 if u < frac else 0)


def _echo(
    items: Iterable[T], factor: Factor, seed: int, epoch: int, counters: EchoCounters | None, per_batch: bool
) -> Iterator[T]:
    auto = factor if isinstance(factor, AutoEcho) else None
    c = counters if counters is not None else EchoCounters()
    it = iter(items)
    window = [0, 0, 0.0, 0.0]  # fresh, emitted, wait_s, downstream_s since the last AutoEcho update
    index = 0
    # Per-item host clocks, not hasten.timing.Stopwatch: there is no device to synchronise
    # here, and its extra CPU-time read on every item would cost more than the stage itself.
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        wait = time.perf_counter() - t0
        c.upstream_wait_s += wait
        e = auto.factor if auto is not None else factor
        n = echo_copies(e, seed=seed, epoch=epoch, index=index)
        index += 1
        if per_batch:
            c.fresh_batches += 1
        else:
            c.fresh_examples += 1
        downstream = 0.0
        for _ in range(n):
            t1 = time.perf_counter()
            if not per_batch:
                c.items_emitted += 1
            yield item
            downstream += time.perf_counter() - t1
        c.downstream_s += downstream
        if auto is not None:
            window[0] += 1
            window[1] += n
            window[2] += wait
            window[3] += downstream
            if window[0] >= auto.interval:
                auto.observe(*window)
                window = [0, 0, 0.0, 0.0]


def echo_examples(
    examples: Iterable[T], factor: Factor, *, seed: int = 0, epoch: int = 0, counters: EchoCounters | None = None
) -> Iterator[T]:
    """Yield each example ``factor`` times in a row (see the module docstring).

    Put it before the augmentation for ``example-before`` echoing, after it for
    ``example-after``; follow it with ``shuffle_buffer``. ``factor`` may be an
    ``AutoEcho``, which then sees this stage's timings. Use a different ``epoch``
    per pass so the non-integral draws differ between epochs.
    """
    return _echo(examples, check_factor(factor), seed, epoch, counters, per_batch=False)


def echo_batches(
    batches: Iterable[T], factor: Factor, *, seed: int = 0, epoch: int = 0, counters: EchoCounters | None = None
) -> Iterator[T]:
    """Yield each batch ``factor`` times in a row: batch echoing.

    Works on any iterable of batches, a ``torch.utils.data.DataLoader`` included.
    """
    return _echo(batches, check_factor(factor), seed, epoch, counters, per_batch=True)


def shuffle_buffer(items: Iterable[T], size: int, *, seed: int = 0) -> Iterator[T]:
    """Shuffle a stream through a buffer of ``size`` items (as tf.data's shuffle).

    Each incoming item replaces a uniformly chosen buffered one, which is
    yielded; the rest is flushed in random order at the end. Every item comes
    out exactly once. ``size`` 0 or 1 passes the stream through unchanged.
    """
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
