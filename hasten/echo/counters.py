"""Counters for an input pipeline with data echoing.

What an echo stage and a training loop can observe about each other: how many
fresh examples were read, how many items and batches were handed on, how long
each side waited for the other, and how often one batch holds several copies
of the same example. ``idle_fraction`` is the share of the training loop's time
spent waiting for input, i.e. how idle the accelerator was.

Changes the training math: no (observation only).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TypeVar

from hasten.timing import Stopwatch

T = TypeVar("T")


@dataclass
class EchoCounters:
    fresh_examples: int = 0  # examples read from upstream (each counted once, before echoing)
    fresh_batches: int = 0  # batches read from upstream by a batch-echo stage
    items_emitted: int = 0  # examples handed downstream by an example-echo stage, copies included
    batches_emitted: int = 0  # batches handed to the training loop, copies included
    upstream_wait_s: float = 0.0  # time an echo stage spent blocked on its upstream
    downstream_s: float = 0.0  # time between an echo stage handing out an item and the next request
    loader_wait_s: float = 0.0  # time the training loop spent waiting for a batch
    step_time_s: float = 0.0  # time the training loop spent between batches (its own work)
    examples_in_batches: int = 0
    duplicates_in_batches: int = 0  # examples that are a second (third, ...) copy within their batch

    @property
    def idle_fraction(self) -> float:
        """Share of the training loop's wall time spent waiting for input."""
        total = self.loader_wait_s + self.step_time_s
        return self.loader_wait_s / total if total > 0 else 0.0

    @property
    def duplicate_rate(self) -> float:
        """Share of examples in batches that repeat another example of the same batch."""
        if self.examples_in_batches == 0:
            return 0.0
        return self.duplicates_in_batches / self.examples_in_batches

    def record_batch(self, keys: Iterable[Hashable]) -> None:
        """Count one batch by the identity keys of its examples (e.g. dataset indices)."""
        keys = list(keys)
        self.examples_in_batches += len(keys)
        self.duplicates_in_batches += len(keys) - len(set(keys))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["idle_fraction"] = self.idle_fraction
        d["duplicate_rate"] = self.duplicate_rate
        return d


def timed_loader(batches: Iterable[T], counters: EchoCounters, device=None) -> Iterator[T]:
    """Yield ``batches`` unchanged, timing the training loop around them.

    Time blocked in ``next()`` is ``loader_wait_s`` (the accelerator idles); time
    between receiving a batch and asking for the next is ``step_time_s``. With a
    CUDA ``device`` both clocks synchronise it first, so a step's queued kernels
    count as step time, not as waiting.
    """
    it = iter(batches)
    clock = Stopwatch(device)
    while True:
        clock.start()
        try:
            batch = next(it)
        except StopIteration:
            return
        counters.loader_wait_s += clock.stop()
        counters.batches_emitted += 1
        clock.start()
        yield batch
        counters.step_time_s += clock.stop()
