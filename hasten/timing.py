"""One stopwatch and one device synchronisation for every training loop and benchmark.

GPU work is asynchronous: a clock read without synchronising first measures how
fast work was queued, not how fast it ran. Every timed span in hasten therefore
starts and stops through :class:`Stopwatch`, which synchronises ``device`` at
both ends.
"""

from __future__ import annotations

import time

import torch

__all__ = ["Stopwatch", "synchronize"]


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued work on ``device`` (CUDA); a no-op on the CPU."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Accumulates wall time, and this process's CPU time, over start/stop spans,
    synchronising ``device`` before each clock read.

    CPU time is the steadier number on a shared machine: other jobs stretch wall
    time, not this process's CPU seconds.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.elapsed = 0.0
        self.cpu_elapsed = 0.0
        self._t0: tuple[float, float] | None = None

    @property
    def running(self) -> bool:
        return self._t0 is not None

    def start(self) -> None:
        synchronize(self.device)
        self._t0 = (time.perf_counter(), time.process_time())

    def stop(self) -> float:
        """End the current span; returns its wall seconds (0 when not running)."""
        if self._t0 is None:
            return 0.0
        synchronize(self.device)
        span = time.perf_counter() - self._t0[0]
        self.elapsed += span
        self.cpu_elapsed += time.process_time() - self._t0[1]
        self._t0 = None
        return span

    def __enter__(self) -> Stopwatch:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def interleaved(configs, repeats: int, seed: int = 0):
    """``(repeat, config)`` pairs: every config once per repeat, in a fresh shuffled
    order each repeat (seeded, so the order is recorded and reproducible).

    Why: load on a shared machine drifts within a run; running configurations in
    a fixed order puts that drift into their differences. Shuffling within each
    repeat spreads it evenly, so a comparison's spread shows it.
    """
    import random

    configs = list(configs)
    rng = random.Random(seed)
    for r in range(repeats):
        order = configs[:]
        rng.shuffle(order)
        for c in order:
            yield r, c
