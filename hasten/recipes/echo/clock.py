"""A slow source on a modelled clock: the wall time a training run would have had if its
fresh examples came from an upstream that delivers one batch every ``R`` step times.

Why: a source that sleeps (``hasten.stream.slow_storage``) makes a run without echoing
at R = 8 last eight times its compute, with the CPU idle; a sweep at a real target
(minutes of compute per run) cannot afford that on two cores. Here the training runs
at full speed and each of several clocks adds the waits that source would have
caused: the upstream (a producer of ``per_example_s`` per fresh example, at most
``lead`` examples ahead of the consumer, as a loader with read-ahead is) is a model;
every step's time is the real, measured one. One run therefore gives its wall time
at every R at once, as long as its training does not depend on the time (no
echoing, or a fixed factor); AutoEcho, which decides from the waits, takes one
clock, whose waits it is told.

Producer: example j is ready at ``p_j = max(p_{j-1}, c_{j-lead}) + per_example_s``,
where ``c_k`` is the time the consumer took example k (the read-ahead is full until
then). Consumer: takes example j at ``c_j = max(now, p_j)`` and waits the difference;
each step then adds its measured time to ``now``.

Usable alone: wrap any iterator of fresh items with :meth:`ModelledClocks.items`
and call :meth:`ModelledClocks.advance` with each step's measured seconds.

Changes the training math: no (timing only).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable, Iterator, Sequence


class ModelledClocks:
    """One clock per upstream speed (seconds per fresh example), advanced together."""

    def __init__(self, per_example_s: Sequence[float], lead: int) -> None:
        if not per_example_s or any(not u > 0 for u in per_example_s):
            raise ValueError(f"per_example_s must be positive seconds; got {list(per_example_s)}")
        if lead < 1:
            raise ValueError(f"lead must be >= 1 example; got {lead}")
        self.per_example_s = [float(u) for u in per_example_s]
        self.lead = lead
        k = len(self.per_example_s)
        self.now = [0.0] * k  # the consumer's time on each clock
        self.waited = [0.0] * k  # of which spent waiting for the upstream
        self.stepped = 0.0  # of which measured (the same on every clock)
        self._ready = [0.0] * k  # p of the last example produced
        self._taken: list[deque] = [deque(maxlen=lead) for _ in range(k)]  # c of the last `lead` examples

    def take(self) -> None:
        """The consumer takes the next fresh example: each clock waits for it if it is not ready."""
        for i, u in enumerate(self.per_example_s):
            taken = self._taken[i]
            start = taken[0] if len(taken) == self.lead else 0.0  # a slot frees when example j-lead is taken
            self._ready[i] = max(self._ready[i], start) + u
            wait = max(0.0, self._ready[i] - self.now[i])
            self.now[i] += wait
            self.waited[i] += wait
            taken.append(self.now[i])

    def advance(self, seconds: float) -> None:
        """Add a step's measured seconds to every clock (the upstream keeps producing meanwhile)."""
        self.stepped += seconds
        for i in range(len(self.now)):
            self.now[i] += seconds

    def time(self, clock: int = 0) -> float:
        """Seconds for a stage's timings under clock ``clock``: the host's clock plus the
        waits modelled so far, so that a stage timing a pull (``hasten.echo.stages``, and
        AutoEcho through it) sees the wait the modelled upstream caused."""
        return time.perf_counter() + self.waited[clock]

    def items(self, fresh: Iterable) -> Iterator:
        """``fresh`` with :meth:`take` called for each item as the consumer pulls it."""
        for item in fresh:
            self.take()
            yield item
