"""AutoEcho: choose the echo factor online from measured idle time.

Choi et al. (2019, "Faster Neural Network Training with Data Echoing",
arXiv:1907.05550) show that with R = upstream time / downstream time, echoing up
to e = R costs no extra wall time per step, and tune e by hand. AutoEcho (new in
hasten, not in the paper) measures R while training and sets e to about R,
capped at ``e_max``; it follows R when it changes and falls back to e = 1 when the
pipeline is not input-bound.

How R is measured. The echo stage reports, per window of fresh items, the time it
waited on upstream (W), the time downstream took between its requests (D), and
how many items it emitted (N) for F fresh ones. When the stage waits, the
upstream is the bottleneck and is busy the whole window, so one fresh item takes
(W + D) / F and one emitted item D / N:  R = (N / F) * (1 + W / D). When it does
not wait, R >= N / F is all we learn, so AutoEcho lowers e a little to probe;
once waiting reappears it has a fresh measurement. This needs an upstream that
runs concurrently (a prefetching thread or worker processes), as any real
input pipeline does.

On several data-parallel ranks, every rank must take the same number of steps.
With ``torch.distributed`` initialised, the estimate is averaged over ranks at
each update (the updates fall on the same fresh item on every rank because the
echo draws are seeded by epoch and index, not by rank), so all ranks use one e.

Changes the training math: yes, as echoing does (examples are repeated); the
choice of e depends on timing, so runs are not bit-reproducible.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from hasten.timing import Stopwatch


class AutoEcho:
    """An echo factor that updates itself; pass it wherever a factor is accepted.

    ``e_max``: upper bound on e. ``interval``: fresh items per measurement window.
    ``idle_threshold``: waiting share above which the pipeline counts as
    input-bound. ``probe``: relative step down of e when not input-bound.
    ``smoothing``: weight of the newest estimate in the running estimate of R.
    ``off_below``: estimated R under which echoing stays off (timing noise alone
    can suggest R = 1.1; echoing that little gains little and costs fresh data).
    The first window is ignored: it holds the pipeline's start-up.
    """

    def __init__(
        self,
        e_max: float = 8.0,
        *,
        interval: int = 64,
        idle_threshold: float = 0.02,
        probe: float = 0.1,
        smoothing: float = 0.5,
        off_below: float = 1.25,
        sync: bool = True,
    ):
        if not (isinstance(e_max, (int, float)) and math.isfinite(e_max) and e_max >= 1):
            raise ValueError(f"AutoEcho e_max must be a number >= 1; got {e_max!r}")
        if not (isinstance(interval, int) and interval >= 1):
            raise ValueError(f"AutoEcho interval must be an integer >= 1 (fresh items per window); got {interval!r}")
        if not 0 <= idle_threshold < 1:
            raise ValueError(f"AutoEcho idle_threshold must be in [0, 1); got {idle_threshold!r}")
        if not 0 < probe < 1:
            raise ValueError(f"AutoEcho probe must be in (0, 1); got {probe!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"AutoEcho smoothing must be in (0, 1]; got {smoothing!r}")
        self.e_max = float(e_max)
        self.interval = interval
        self.idle_threshold = idle_threshold
        self.probe = probe
        self.smoothing = smoothing
        self.off_below = off_below
        self.sync = sync
        self.factor = 1.0
        self.ratio_estimate: float | None = None
        self.windows = 0
        self._paused_s = 0.0  # time inside paused() since the last window
        self.history: list[tuple[float, float]] = []  # (factor used, R estimate or nan) per window

    def observe(self, fresh: int, emitted: int, wait_s: float, downstream_s: float) -> float:
        """Take one window's measurements, update and return the echo factor."""
        downstream_s -= self._paused_s
        self._paused_s = 0.0
        if fresh <= 0 or emitted <= 0 or downstream_s <= 0:
            return self.factor
        self.windows += 1
        if self.windows == 1:
            return self.factor
        waiting = wait_s / (wait_s + downstream_s)
        input_bound = waiting > self.idle_threshold
        estimate = (emitted / fresh) * (1.0 + wait_s / downstream_s) if input_bound else math.nan
        estimate = self._agree(estimate)
        if math.isnan(estimate):
            # Not waiting: R is at least the current factor; step down to find out how much.
            new = max(1.0, self.factor * (1.0 - self.probe))
        else:
            if self.ratio_estimate is None:
                self.ratio_estimate = estimate
            else:
                self.ratio_estimate += self.smoothing * (estimate - self.ratio_estimate)
            new = 1.0 if self.ratio_estimate < self.off_below else min(self.e_max, self.ratio_estimate)
        self.history.append((self.factor, estimate))
        self.factor = new
        return new

    @contextmanager
    def paused(self):
        """Leave the time inside this block (e.g. an evaluation) out of the downstream time."""
        clock = Stopwatch()
        clock.start()
        try:
            yield
        finally:
            self._paused_s += clock.stop()

    def _agree(self, estimate: float) -> float:
        """The mean estimate over data-parallel ranks (nan, i.e. 'not input-bound', only if no rank waits)."""
        if not self.sync:
            return estimate
        try:
            import torch.distributed as dist
        except ImportError:
            return estimate
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return estimate
        import torch

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        valid = not math.isnan(estimate)
        t = torch.tensor([estimate if valid else 0.0, 1.0 if valid else 0.0], device=device)
        dist.all_reduce(t)
        return math.nan if t[1] == 0 else float(t[0] / t[1])

    def __repr__(self) -> str:
        return f"AutoEcho(factor={self.factor:.2f}, e_max={self.e_max})"
