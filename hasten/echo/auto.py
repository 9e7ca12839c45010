"""AutoEcho: choose the echo factor online from measured idle time and the value of repeats.

Choi et al. (2019, "Faster Neural Network Training with Data Echoing",
arXiv:1907.05550) show that with R = upstream time / downstream time, echoing up
to e = R costs no extra wall time per step, and tune e by hand. AutoEcho (new in
hasten, not in the paper) measures R while training and sets e to a little above
R, capped at ``e_max`` and at what repeats are still worth; it follows R when it
changes and falls back to e = 1 when the pipeline is not input-bound.

Why a little above R. Wall time to a target is (steps needed) x max(step, R x
step / e). Below R every extra copy removes waiting; above R it removes none and
only adds steps. Exactly at e = R any jitter of the upstream shows up as waiting,
so AutoEcho aims at R x (1 + ``headroom``): a few per cent more repeats, no waiting.
It at most doubles e per window, so one window's outlier cannot throw e to ``e_max``.

How R is measured. The echo stage reports, per window of fresh items, the time it
waited on upstream (W), the time downstream took between its requests (D), and
how many items it emitted (N) for F fresh ones. When the stage waits, the
upstream is the bottleneck and is busy the whole window, so one fresh item takes
(W + D) / F and one emitted item D / N:  R = (N / F) * (1 + W / D). When it does
not wait, R >= N / F is all we learn, so AutoEcho lowers its estimate a little each
such window (``probe`` / 2); once waiting reappears it has a fresh measurement.
This needs an upstream that runs concurrently (a prefetching thread or worker
processes), as any real input pipeline does.

The value of a repeat. Each extra copy is worth less than the last; once the
network has learned an example, a repeat of it teaches little. A training loop
that knows which items are repeats (example echoing numbers the copies) can
report the mean loss on first copies and on repeats of the same steps
(``observe_loss``). While repeats track fresh data their losses agree; when the
loss on repeats falls more than ``repeat_tolerance`` below the fresh loss, the
repeats are being memorised, and AutoEcho lowers a cap on e by ``probe``; it
raises the cap again while the losses agree. Without loss reports the cap is
``e_max``.

On several data-parallel ranks, every rank must take the same number of steps.
With ``torch.distributed`` initialised, the R estimate and the cap are averaged
over ranks at each update (the updates fall on the same fresh item on every rank
because the echo draws are seeded by epoch and index, not by rank), so all ranks
use one e.

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
    ``headroom``: e = R x (1 + headroom), so upstream jitter causes no waiting.
    ``repeat_tolerance``: relative loss gap (fresh minus repeats) beyond which
    repeats count as memorised and the cap on e comes down.
    ``loss_smoothing``: weight of each loss report in the running loss ratio.
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
        headroom: float = 0.1,
        repeat_tolerance: float = 0.1,
        loss_smoothing: float = 0.05,
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
        if not 0 <= headroom < 1:
            raise ValueError(f"AutoEcho headroom must be in [0, 1); got {headroom!r}")
        if not 0 < repeat_tolerance < 1:
            raise ValueError(f"AutoEcho repeat_tolerance must be in (0, 1); got {repeat_tolerance!r}")
        if not 0 < loss_smoothing <= 1:
            raise ValueError(f"AutoEcho loss_smoothing must be in (0, 1]; got {loss_smoothing!r}")
        self.e_max = float(e_max)
        self.headroom = headroom
        self.repeat_tolerance = repeat_tolerance
        self.loss_smoothing = loss_smoothing
        self.cap = float(e_max)  # the largest e repeats are still worth (lowered by observe_loss)
        self.loss_ratio: float | None = None  # running mean of (loss on repeats) / (loss on fresh items)
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
        self._loop = [0, 0.0, 0.0]  # items, wait_s, step_s reported by record_step since the last window
        self._loop_reports = False
        self._carry_fresh = 0  # fresh items of windows without a step, not yet accounted
        self.history: list[tuple[float, float]] = []  # (factor used, R estimate or nan) per window

    def record_step(self, wait_s: float, step_s: float, items: int) -> None:
        """The training loop's report of one step: seconds it waited for the batch,
        seconds of its own work, items in the batch (module docstring)."""
        self._loop[0] += items
        self._loop[1] += wait_s
        self._loop[2] += step_s

    def observe(self, fresh: int, emitted: int, wait_s: float, downstream_s: float) -> float:
        """Take one window's measurements, update and return the echo factor."""
        downstream_s -= self._paused_s
        self._paused_s = 0.0
        items, loop_wait, loop_step = self._loop
        self._loop = [0, 0.0, 0.0]
        if items > 0 and loop_step > 0:
            # The loop's view of items and time replaces the stage's (its clocks already
            # leave out evaluations). The waiting stays the stage's own wait on upstream:
            # the loop's wait also holds the pipeline's own work between steps (echo stage,
            # buffer, batching), which does not shrink as e grows; counted as waiting it
            # would make R look like e x (1 + overhead) and drive e up without end.
            self._loop_reports = True
            total = loop_wait + loop_step
            wait_s = min(wait_s, total)
            emitted, downstream_s = items, max(loop_step, total - wait_s)
        elif self._loop_reports:
            # A buffer took this window's items: no step yet. Its fresh items count in the
            # window whose steps finally consume them (their wait shows up there).
            self._carry_fresh += fresh
            return self.factor
        fresh += self._carry_fresh
        self._carry_fresh = 0
        if fresh <= 0 or emitted <= 0 or downstream_s <= 0:
            return self.factor
        self.windows += 1
        if self.windows == 1:
            return self.factor
        self._update_cap()
        waiting = wait_s / (wait_s + downstream_s)
        input_bound = waiting > self.idle_threshold
        estimate = (emitted / fresh) * (1.0 + wait_s / downstream_s) if input_bound else math.nan
        estimate, self.cap = self._agree(estimate, self.cap)
        if math.isnan(estimate):
            # Not waiting: R is at least the current factor; lower the estimate a little
            # so that, if R has fallen, waiting reappears and measures it again.
            below = self.factor / (1.0 + self.headroom)
            self.ratio_estimate = (below if self.ratio_estimate is None else self.ratio_estimate) * (1 - self.probe / 2)
        elif self.ratio_estimate is None:
            self.ratio_estimate = estimate
        else:
            self.ratio_estimate += self.smoothing * (estimate - self.ratio_estimate)
        if self.ratio_estimate < self.off_below:
            new = 1.0
        else:
            # At most doubling per window: a stall while a buffer grows inflates one window's R.
            new = max(1.0, min(self.e_max, self.cap, 2 * self.factor, self.ratio_estimate * (1.0 + self.headroom)))
        self.history.append((self.factor, estimate))
        self.factor = new
        return new

    def observe_loss(self, fresh_loss: float, repeat_loss: float) -> float:
        """Take the mean training loss on first copies and on repeats of one step
        (or a few); update and return the cap on e (module docstring)."""
        if not (math.isfinite(fresh_loss) and math.isfinite(repeat_loss)) or fresh_loss <= 0:
            return self.cap
        ratio = repeat_loss / fresh_loss
        if self.loss_ratio is None:
            self.loss_ratio = ratio
        else:
            self.loss_ratio += self.loss_smoothing * (ratio - self.loss_ratio)
        return self.cap

    def _update_cap(self) -> None:
        if self.loss_ratio is None:
            return
        if self.loss_ratio < 1.0 - self.repeat_tolerance:
            self.cap = max(1.0, min(self.cap, self.factor) * (1.0 - self.probe))
        elif self.loss_ratio > 1.0 - self.repeat_tolerance / 2:
            self.cap = min(self.e_max, self.cap * (1.0 + self.probe))

    @contextmanager
    def paused(self):
        """Leave the time inside this block (e.g. an evaluation) out of the downstream time."""
        clock = Stopwatch()
        clock.start()
        try:
            yield
        finally:
            self._paused_s += clock.stop()

    def _agree(self, estimate: float, cap: float) -> tuple[float, float]:
        """The mean estimate over data-parallel ranks (nan, i.e. 'not input-bound', only if
        no rank waits) and the mean cap, so that every rank computes the same e."""
        if not self.sync:
            return estimate, cap
        try:
            import torch.distributed as dist
        except ImportError:
            return estimate, cap
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return estimate, cap
        import torch

        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        valid = not math.isnan(estimate)
        t = torch.tensor([estimate if valid else 0.0, 1.0 if valid else 0.0, cap], device=device,
                         dtype=torch.float64)
        dist.all_reduce(t)
        world = dist.get_world_size()
        return (math.nan if t[1] == 0 else float(t[0] / t[1])), float(t[2] / world)

    def __repr__(self) -> str:
        return f"AutoEcho(factor={self.factor:.2f}, e_max={self.e_max})"
