"""Data echoing stages: repeat prepared data to keep the accelerator busy.

Based on: Choi, Passos, Shallue, Dahl, "Faster Neural Network Training with Data
Echoing" (2019, arXiv:1907.05550). When upstream (read, decode, augment) is
slower than a training step, an echo stage after the bottleneck hands each item
on e times, so the accelerator trains on repeated data instead of waiting.
Where the stage sits gives the paper's variants:

- ``example-before``: echo examples before augmentation; every copy gets its
  own random augmentation (the paper's best variant);
- ``example-after``: echo augmented examples; the copies are identical;
- ``batch``: echo whole batches after batching; ``group=k`` echoes runs of k batches,
  the micro-batches of one optimizer step under gradient accumulation.

A shuffle buffer (``hasten.echo.shuffle_buffer``) after an example-echo stage spreads
the copies apart, so fewer land in the same batch; ``default_shuffle_buffer(e, batch_size)``
sizes it so that about 1% of a batch are repeated copies (derivation in its docstring),
and ``warn_if_small_buffer`` warns when a given buffer leaves many more.

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
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
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


# Within-batch duplicate share that the default shuffle buffer aims at.
DUPLICATE_RATE = 0.01


def default_shuffle_buffer(factor: float, batch_size: int, duplicate_rate: float = DUPLICATE_RATE) -> int:
    """Shuffle-buffer size (items) after example echoing for about ``duplicate_rate``
    of each batch to be a second copy of an example already in it.

    Derivation. In a buffer of K items where each arriving item replaces a random
    one (``shuffle_buffer``), an item leaves after a geometric number of arrivals
    with mean K, close to an exponential delay with mean K. Two copies of an example
    enter next to each other, so the distance d between their output positions is
    the difference of two such delays: Laplace with scale K, P(|d| > x) = exp(-x/K).
    Two items d apart share a batch of B with probability max(0, 1 - |d|/B), so a
    pair of copies shares a batch with probability
    p = integral_0^B (1 - x/B) exp(-x/K) / K dx = 1 - (K/B)(1 - exp(-B/K)) ~ B / (2K)
    for K >> B. An example with e copies has e(e-1)/2 pairs and emits e items, so
    the duplicate share is about (e - 1) p / 2 ~ (e - 1) B / (4K). Setting it to
    ``duplicate_rate`` gives

        K = ceil((e - 1) * B / (4 * duplicate_rate))

    (e = 5, B = 64: K = 6,400 for 1%; the 256-item buffer gives 25% by the formula,
    measured 20%, the exact p and triple copies making up the difference). 0 for
    e = 1: without copies there is nothing to spread apart.
    """
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"echo factor must be a number >= 1; got {factor!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    if not 0 < duplicate_rate < 1:
        raise ValueError(f"duplicate_rate must be in (0, 1); got {duplicate_rate!r}")
    return math.ceil((factor - 1) * batch_size / (4 * duplicate_rate))


def expected_duplicate_rate(size: int, factor: float, batch_size: int) -> float:
    """Predicted within-batch duplicate share after a ``size``-item shuffle buffer
    (the exact pair probability of ``default_shuffle_buffer``'s derivation)."""
    if factor <= 1:
        return 0.0
    if size <= 1:  # copies stay next to each other: nearly all share a batch
        p = 1.0 - 1.0 / batch_size
    else:
        p = 1.0 - (size / batch_size) * (1.0 - math.exp(-batch_size / size))
    return min(1.0 - 1.0 / factor, (factor - 1) * p / 2)


def warn_if_small_buffer(size: int, factor: float, batch_size: int, *, stacklevel: int = 2) -> bool:
    """Warn (and return True) when ``size`` leaves more than 4x the default duplicate
    share in each batch for echo factor ``factor``: copies that share a batch add
    no information, and the echoed steps lose value (measured: e = 5, batch 64,
    buffer 256 lost 6 points of accuracy against buffer 8,192)."""
    if factor <= 1:
        return False
    rate = expected_duplicate_rate(size, factor, batch_size)
    if rate <= 4 * DUPLICATE_RATE:
        return False
    warnings.warn(f"shuffle buffer of {size} items with echo factor {factor:g} and batch {batch_size}: about "
                  f"{rate:.0%} of each batch will be repeated copies; use about "
                  f"{default_shuffle_buffer(factor, batch_size)} (hasten.echo.default_shuffle_buffer)",
                  stacklevel=stacklevel + 1)
    return True


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


def _check_group(group: int) -> int:
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"echo group must be an integer >= 1 (batches echoed together, e.g. the micro-batches "
                         f"of one optimizer step); got {group!r}")
    return group


def _echo(
    items: Iterable[T], factor: Factor, seed: int, epoch: int, counters: EchoCounters | None, per_batch: bool,
    clock: Callable[[], float] | None = None, group: int = 1,
) -> Iterator[T]:
    auto = factor if isinstance(factor, AutoEcho) else None
    clock = clock or time.perf_counter  # looked up per call, not at import
    c = counters if counters is not None else EchoCounters()
    it = iter(items)
    window = [0, 0, 0.0, 0.0]  # fresh, emitted, wait_s, downstream_s since the last AutoEcho update
    index = 0
    # Two host clocks per fresh run of ``group`` items, not per copy, and no
    # hasten.timing.Stopwatch: there is no device to synchronise here, and per-copy clock
    # reads and bookkeeping cost about 5% of a 4.5 ms step at e = 1 (the echo sweep). The
    # downstream time of a run goes from handing out its first copy until its next run is
    # asked for.
    top = clock()
    while True:
        if group == 1:
            try:
                run = (next(it),)
            except StopIteration:
                return
        else:
            run = tuple(islice(it, group))
            if not run:
                return
        got = clock()
        wait = got - top
        c.upstream_wait_s += wait
        e = auto.factor if auto is not None else factor
        n = echo_copies(e, seed=seed, epoch=epoch, index=index)
        index += 1
        size = len(run)
        if per_batch:
            c.fresh_batches += size
        else:
            c.fresh_examples += 1
            c.items_emitted += n
        if size == 1:
            item = run[0]
            for _ in range(n):
                yield item
        else:
            for _ in range(n):
                yield from run
        top = clock()
        downstream = top - got
        c.downstream_s += downstream
        if auto is not None:
            window[0] += size
            window[1] += n * size
            window[2] += wait
            window[3] += downstream
            if window[0] >= auto.interval:
                auto.observe(*window)
                window = [0, 0, 0.0, 0.0]


def echo_examples(
    examples: Iterable[T], factor: Factor, *, seed: int = 0, epoch: int = 0, counters: EchoCounters | None = None,
    clock: Callable[[], float] | None = None,
) -> Iterator[T]:
    """Yield each example ``factor`` times in a row (see the module docstring).

    Put it before the augmentation for ``example-before`` echoing, after it for
    ``example-after``; follow it with ``shuffle_buffer``. ``factor`` may be an
    ``AutoEcho``, which then sees this stage's timings. Use a different ``epoch``
    per pass so the non-integral draws differ between epochs. ``clock``: the seconds the
    stage's timings (and AutoEcho's) are read from (default ``time.perf_counter``); a
    modelled source passes its own (``hasten.recipes.echo.clock``).
    """
    return _echo(examples, check_factor(factor), seed, epoch, counters, per_batch=False, clock=clock)


def echo_batches(
    batches: Iterable[T], factor: Factor, *, group: int = 1, seed: int = 0, epoch: int = 0,
    counters: EchoCounters | None = None, clock: Callable[[], float] | None = None,
) -> Iterator[T]:
    """Yield each batch ``factor`` times in a row: batch echoing.

    Works on any iterable of batches, a ``torch.utils.data.DataLoader`` included.

    ``group``: echo runs of ``group`` consecutive batches as one item: b1, b2, b1, b2, b3,
    b4, b3, b4, ... for ``group=2``, e = 2 (the last run of a pass may be shorter). Under
    gradient accumulation over k micro-batches per optimizer step, ``group=k`` repeats
    whole optimizer steps and keeps the micro-batches of a step distinct: batch echoing of
    the step's effective batch, as the paper echoes a batch. With ``group=1`` such a step
    would take k copies of one micro-batch, a gradient of 1/k of the data (issue 34 found
    fresh examples per second falling from 236 to 180 that way). The loop's steps must start
    at the first batch of each pass (``for i, b in enumerate(...)``, a step every k)::

        for i, (x, y) in enumerate(echo_batches(loader, 2, group=accum)):
            (loss_fn(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                opt.step(); opt.zero_grad()

    Changes the training math: yes, as batch echoing does (each step's data is seen e
    times, in e different optimizer steps).
    """
    return _echo(batches, check_factor(factor), seed, epoch, counters, per_batch=True, clock=clock,
                 group=_check_group(group))


def auto_shuffle_buffer(auto: AutoEcho, batch_size: int) -> Callable[[], int]:
    """The size function for ``shuffle_buffer`` after example echoing with ``auto``:
    ``default_shuffle_buffer(e, batch_size)`` for the largest e so far, recomputed only
    when e rises (it is read once per item).

    It grows with e and never shrinks. A buffer that shrank with e handed its surplus to
    the loop at once: AutoEcho lowers e by 5% in a window without waiting, the surplus
    fed that window's steps, so the next window did not wait either, and e fell to 1 at
    R = 3.75 (a modelled upstream, ``tests/test_echo_auto.py``). A buffer sized for a
    larger e only spreads the copies further apart."""
    default_shuffle_buffer(1.0, batch_size)  # checks batch_size now, not on the first item
    last = [1.0, 0]

    def size() -> int:
        e = auto.factor
        if e > last[0]:
            last[0], last[1] = e, default_shuffle_buffer(e, batch_size)
        return last[1]

    return size
