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
The first measured R (the first full window after the ignored start-up window in
which the stage waited) sets e directly: climbing there by doublings left a fixed
factor's worth of waiting in every window on the way (hasten's sweep: idle 41-56%
against 20-35% for a fixed factor near the same e). After that e at most doubles
per window, so one later window's outlier cannot throw e to ``e_max``.

How R is measured. The echo stage reports, per window of fresh items, the time it
waited on upstream (W), the time downstream took between its requests (D), and
how many items it emitted (N) for F fresh ones. When the stage waits, the
upstream is the bottleneck and is busy the whole window, so one fresh item takes
(W + D) / F and one emitted item D / N:  R = (N / F) * (1 + W / D). When it does
not wait, R >= N / F is all we learn, so AutoEcho lowers its estimate a little each
such window (``probe`` / 2); once waiting reappears it has a fresh measurement. A window that waits, but
so little that its R lies within half the headroom above the factor in use, holds
e: that is the jitter the headroom absorbs, and taken as a measurement it raised e
by (1 + headroom) per window up to ``e_max`` (hasten's sweep: mean e 7.1 at R 5.5).
This needs an upstream that runs concurrently (a prefetching thread or worker
processes), as any real input pipeline does.

The value of a repeat, and the budget. A repeat is worth less than a fresh
example: with a training budget fixed in steps, echoing at e feeds 1/e of the
fresh data, and in the paper's regime (a learning-rate schedule over a fixed
budget) every e from 2 to 8 ended about a point below the baseline at the
baseline's step count (hasten's sweep, docs/results/echo.md). So AutoEcho keeps the
budget in *effective examples*: the first copy of an example counts 1, copy 1
(its first repeat) ``repeat_value``, copy k >= 2 ``later_repeat_value x exp(-(k - 2)
/ repeat_decay)``, times the measured loss ratio below when repeats are being
memorised. The defaults are measured, not borrowed: ``benchmarks/echo_repeat_value.py``
(``hasten.recipes.echo.value``) trains at e = 2, 4, 6 and 8 with 1 to 1.6x the
baseline's steps on a CIFAR-10-JPEG subset held out from the sweep and finds the
steps at which echoed runs reliably (mean minus one std over 8 seeds) match the
baseline's mean: 1.23 to 1.29x, with no trend in e. A cost flat in e is what the
two values fit (least squares: 0.57 for the first repeat, 0.80 for each later one,
no decay); one value per repeat cannot give e = 2 and e = 8 the same steps, and the
decay measured for language-model pre-training (R* = 15.4 repetitions, Muennighoff
et al., arXiv:2305.16264; the previous default, a first repeat worth 0.94) gave
e = 2 1.03x. With the defaults every e from 2 to 8 trains 1.26x the baseline's steps;
below R those steps cost no wall time. Other models and data may value repeats
differently: rerun the calibration on yours and pass the values. The echo stage
records the value of every item it emits; the training loop reports how many items
each step took (``count``) and runs its schedule on ``progress(budget_examples)`` instead of the
step count, ending at 1: the run then gets the effective examples the baseline got,
whatever e was used when (e = 1 leaves the schedule exactly the baseline's). Items
are valued in the order the stage emitted them, not as a shuffle buffer hands them
out, so every data-parallel rank reaches 1 at the same step.

Why e stays at about R whatever the value. Wall time per unit of progress at factor e
is max(e x step, upstream) / (sum of the e copies' values), per fresh item. Below R
the numerator is the upstream's time and every copy of positive value lowers it;
above R it is e x step and a copy worth v < 1 raises it. So the best e is R for any
positive value; a copy worth nothing is the only reason to stop below R, and that
is what the loss on repeats detects: a loop that knows which items are repeats
reports the mean loss on first copies and on repeats of the same steps
(``observe_loss``). While repeats track fresh data the losses agree; when the loss
on repeats falls more than ``repeat_tolerance`` below the fresh loss, the repeats are
being memorised, AutoEcho lowers a cap on e by ``probe`` (and their value by the
loss ratio); it raises the cap again while the losses agree. Without loss reports
the cap is ``e_max``.

On several data-parallel ranks, every rank must take the same number of steps.
With ``torch.distributed`` initialised, the R estimate, the cap and the loss ratio
are averaged over ranks at each update (the updates fall on the same fresh item on
every rank because the echo draws are seeded by epoch and index, not by rank), so
all ranks use one e and value repeats alike. The update runs inside the echo stage,
on whatever thread runs it. When that is not the training thread (a pipeline on a
thread of its own, as ``StreamLoader`` on CUDA), a collective from it on the default
group would interleave with DDP's collectives in an order that differs between
ranks (NCCL then hangs or mixes tensors); ``setup_distributed()``, called on the
training thread of every rank before such a pipeline starts (``StreamLoader`` does),
gives AutoEcho a gloo group of its own on CPU tensors, which DDP never uses.

Changes the training math: yes, as echoing does (examples are repeated); the
choice of e depends on timing, so runs are not bit-reproducible.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hasten.timing import Stopwatch

# What the first repeat of an example and its later repeats are worth next to a fresh
# example (module docstring): the least-squares fit measured by
# benchmarks/echo_repeat_value.py on a CIFAR-10-JPEG subset held out from the echo sweep.
# No decay over further copies: the measurement (e <= 8) shows none.
REPEAT_VALUE = 0.57
LATER_REPEAT_VALUE = 0.80
REPEAT_DECAY = math.inf


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
    ``repeat_value``: what the first repeat is worth next to a fresh example (``count``).
    ``later_repeat_value``: what each later repeat is worth; ``repeat_decay``: copies
    over which that falls by 1/e (inf: not at all).
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
        repeat_value: float = REPEAT_VALUE,
        later_repeat_value: float = LATER_REPEAT_VALUE,
        repeat_decay: float = REPEAT_DECAY,
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
        for name, v in (("repeat_value", repeat_value), ("later_repeat_value", later_repeat_value)):
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ValueError(f"AutoEcho {name} must be in (0, 1] (of a fresh example); got {v!r}")
        if not (isinstance(repeat_decay, (int, float)) and repeat_decay > 0):
            raise ValueError(f"AutoEcho repeat_decay must be > 0 (repetitions); got {repeat_decay!r}")
        self.e_max = float(e_max)
        self.repeat_value = float(repeat_value)
        self.later_repeat_value = float(later_repeat_value)
        self.repeat_decay = float(repeat_decay)
        self.effective_examples = 0.0  # fresh items plus repeats at their value (count)
        self.value_ratio = 1.0  # the agreed loss ratio, <= 1, that scales repeats' value
        # [value, items] runs of emitted items not yet counted: without echoing one run of
        # 1.0, so that the bookkeeping costs O(1) per batch, not per item.
        self._values: deque[list] = deque()
        self._measured = False  # whether a waiting window has set e (the first one sets it directly)
        self._group = None  # AutoEcho's own process group (setup_distributed)
        self._lock = threading.Lock()  # record_step may run on another thread than observe
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
        self.paused_s = 0.0  # all time inside paused()
        self._loop = [0, 0.0, 0.0]  # items, wait_s, step_s reported by record_step since the last window
        self._loop_reports = False
        self._carry_fresh = 0  # fresh items of windows without a step, not yet accounted
        self.history: list[tuple[float, float]] = []  # (factor used, R estimate or nan) per window

    def record_step(self, wait_s: float, step_s: float, items: int) -> None:
        """The training loop's report of one step: seconds it waited for the batch,
        seconds of its own work, items in the batch (module docstring)."""
        with self._lock:
            self._loop[0] += items
            self._loop[1] += wait_s
            self._loop[2] += step_s

    def observe(self, fresh: int, emitted: int, wait_s: float, downstream_s: float) -> float:
        """Take one window's measurements, update and return the echo factor."""
        downstream_s -= self._paused_s
        self._paused_s = 0.0
        with self._lock:
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
        estimate, self.cap, loss_ratio = self._agree(estimate, self.cap, self.loss_ratio)
        if not math.isnan(loss_ratio):
            self.value_ratio = min(1.0, max(0.0, loss_ratio))
        if self._measured and not math.isnan(estimate) and estimate < self.factor * (1 + self.headroom / 2):
            # (The ranks' agreed estimate against the factor they share: every rank holds.)
            # A short wait at the factor in use (at most half the headroom): the jitter the
            # headroom is there to absorb, not a higher R. Taken as a measurement it gave
            # an R a little above e, hence e x (1 + headroom) above that, window after
            # window: e crept up to e_max (hasten's sweep: mean e 7.1 at R 5.5), and copies
            # above R add steps without removing waiting. Hold e instead.
            self.history.append((self.factor, estimate))
            return self.factor
        if math.isnan(estimate):
            # Not waiting: R is at least the current factor; lower the estimate a little
            # so that, if R has fallen, waiting reappears and measures it again.
            below = self.factor / (1.0 + self.headroom)
            self.ratio_estimate = (below if self.ratio_estimate is None else self.ratio_estimate) * (1 - self.probe / 2)
        elif self.ratio_estimate is None or not self._measured:
            self.ratio_estimate = estimate  # the first measurement, not eased guesses, sets R
        else:
            self.ratio_estimate += self.smoothing * (estimate - self.ratio_estimate)
        # The first measured R sets e directly (module docstring); later, at most doubling
        # per window: a stall while a buffer grows inflates one window's R.
        step_limit = 2 * self.factor if self._measured else self.e_max
        self._measured = self._measured or not math.isnan(estimate)
        if self.ratio_estimate < self.off_below:
            new = 1.0
        else:
            new = max(1.0, min(self.e_max, self.cap, step_limit, self.ratio_estimate * (1.0 + self.headroom)))
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

    def copy_value(self, copy: int) -> float:
        """What copy number ``copy`` of an example (0: the first) is worth next to a
        fresh example: ``repeat_value`` for copy 1, ``later_repeat_value x exp(-(copy - 2)
        / repeat_decay)`` after, times the ranks' agreed loss ratio of repeats to first
        copies while that is below 1 (module docstring)."""
        if copy <= 0:
            return 1.0
        if copy == 1:
            return self.repeat_value * self.value_ratio
        return self.later_repeat_value * math.exp(-(copy - 2) / self.repeat_decay) * self.value_ratio

    def emitted(self, copy: int) -> None:
        """The echo stage's record of one emitted item, copy number ``copy``."""
        self._push(self.copy_value(copy), 1)

    def emitted_copies(self, copies: int) -> None:
        """The echo stage's record of ``copies`` copies of one example (numbers 0 to
        copies - 1), in the order it emits them."""
        self._push(1.0, 1)
        for k in range(1, copies):
            self._push(self.copy_value(k), 1)

    def _push(self, value: float, items: int) -> None:
        values = self._values
        if values and values[-1][0] == value:
            values[-1][1] += items
        else:
            values.append([value, items])

    def count(self, items: int) -> float:
        """The training loop took ``items`` more items (examples; batches for batch
        echoing): add the value of as many emitted items, oldest first, to
        ``effective_examples`` and return it. Items no stage recorded count as fresh."""
        values = self._values
        total = 0.0
        while items > 0 and values:
            run = values[0]
            take = min(items, run[1])
            total += run[0] * take
            items -= take
            run[1] -= take
            if run[1] == 0:
                values.popleft()
        self.effective_examples += total + items  # items left over: none recorded, fresh
        return self.effective_examples

    def progress(self, budget_examples: float) -> float:
        """The share of a budget of ``budget_examples`` (the baseline's steps x batch)
        used so far, in effective examples: run the schedule on it, stop at 1."""
        if not budget_examples > 0:
            raise ValueError(f"budget_examples must be > 0; got {budget_examples!r}")
        return self.effective_examples / budget_examples

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
            spent = clock.stop()
            self._paused_s += spent
            self.paused_s += spent

    @staticmethod
    def _distributed():
        """torch.distributed when it runs more than one rank, else None."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        return dist

    def setup_distributed(self) -> None:
        """Create AutoEcho's own gloo process group (module docstring). Call it on the
        training thread of every rank, at the same point, before an echo stage runs on
        another thread; a no-op without ``torch.distributed``, with ``sync=False`` or
        when done already."""
        if self.sync and self._group is None and self._distributed() is not None:
            self._group = dist.new_group(backend="gloo")

    def _agree(self, estimate: float, cap: float, loss_ratio: float | None) -> tuple[float, float, float]:
        """The mean estimate over data-parallel ranks (nan, i.e. 'not input-bound', only if
        no rank waits), the mean cap and the mean loss ratio (nan if no rank has one), so
        that every rank computes the same e and values repeats alike."""
        loss = math.nan if loss_ratio is None else loss_ratio
        if not self.sync or self._distributed() is None:
            return estimate, cap, loss
        group = self._group
        backend = dist.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        valid, has_loss = not math.isnan(estimate), not math.isnan(loss)
        t = torch.tensor([estimate if valid else 0.0, 1.0 if valid else 0.0, cap,
                          loss if has_loss else 0.0, 1.0 if has_loss else 0.0], device=device, dtype=torch.float64)
        dist.all_reduce(t, group=group)
        world = dist.get_world_size(group)
        return ((math.nan if t[1] == 0 else float(t[0] / t[1])), float(t[2] / world),
                (math.nan if t[4] == 0 else float(t[3] / t[4])))

    def __repr__(self) -> str:
        return f"AutoEcho(factor={self.factor:.2f}, e_max={self.e_max})"
