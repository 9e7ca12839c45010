"""AutoEcho: an echo factor that follows the measured input bottleneck while training.

Based on: Choi et al., "Faster Neural Network Training with Data Echoing" (2019,
arXiv:1907.05550): with R = upstream time / downstream time, echoing up to e = R costs
no wall time per step. The paper sets e by hand; AutoEcho (hasten's own) measures R
while training and follows it. Pass it wherever an echo factor is accepted.

The rule, once per window of ``interval`` fresh items (``observe`` has it in full):

    R = (emitted / fresh) x (1 + wait / downstream)    while the echo stage waits on upstream
    e = min(e_max, cap, R x (1 + headroom))            1 while R < off_below

Below R a copy removes waiting; above R it only adds steps; the headroom keeps upstream
jitter from showing up as waiting. The cap comes down while the loss on repeats falls
below the loss on fresh items (``observe_loss``: the repeats are being memorised). The
training schedule runs on effective examples (``count``, ``progress``), where a repeat
counts less than a fresh example, so an echoed run takes the extra steps its repeats
need, at no wall time below R. Under ``torch.distributed`` the ranks agree on one e.
AutoEcho needs an upstream that runs concurrently (DataLoader workers, a prefetch
thread), as any real input pipeline has.

Changes the training math: yes, as echoing does (examples are repeated; the schedule runs
on effective examples); e depends on timing, so runs are not bit-reproducible.
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
# example (``AutoEcho.copy_value``): the least-squares fit measured by
# benchmarks/echo_repeat_value.py on a CIFAR-10-JPEG subset held out from the echo sweep.
# No decay over further copies: the measurement (e <= 8) shows none.
REPEAT_VALUE = 0.57
LATER_REPEAT_VALUE = 0.80
REPEAT_DECAY = math.inf


class AutoEcho:
    """An echo factor that updates itself; pass it wherever a factor is accepted.

    With ``torch.distributed`` initialised (and ``sync``), the R estimate, the cap and the
    loss ratio are averaged over the ranks at every window, so that all ranks use one e,
    value repeats alike and take the same number of steps; see ``setup_distributed``.

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
    over which that falls by 1/e (inf: not at all). Their defaults are measured on
    CIFAR-10-JPEG (``benchmarks/echo_repeat_value.py``, docs/echo.md); other models and
    data may value repeats differently: a loop that reports
    ``hasten.echo.repeat_value.gradient_dots`` (``report_repeat_gradients``) has the
    value measured on its own task while it trains, and the defaults are then only
    where it starts (``value_after`` reports; ``value_memory``: the weight each report
    keeps per later report).
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
        value_after: int = 8,
        value_memory: float = 0.99,
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
        if not (isinstance(value_after, int) and value_after >= 1):
            raise ValueError(f"AutoEcho value_after must be an integer >= 1 (reports); got {value_after!r}")
        if not 0 < value_memory <= 1:
            raise ValueError(f"AutoEcho value_memory must be in (0, 1]; got {value_memory!r}")
        if not (isinstance(repeat_decay, (int, float)) and repeat_decay > 0):
            raise ValueError(f"AutoEcho repeat_decay must be > 0 (repetitions); got {repeat_decay!r}")
        self.e_max = float(e_max)
        self.repeat_value = float(repeat_value)
        self.later_repeat_value = float(later_repeat_value)
        self.repeat_decay = float(repeat_decay)
        self.value_after = value_after
        self.value_memory = float(value_memory)
        # Decayed sums of the reported gradient products (report_repeat_gradients) and their count.
        self._dots = [0.0, 0.0, 0]
        self.value_history: list[float] = []  # the measured value after each window that set it
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

    def expect_step_reports(self) -> None:
        """Say, before the first step, that the training loop will call ``record_step``.

        Windows that end before the loop's first report then carry their fresh items to the
        window of its first steps instead of reading the echo stage's own view. That view,
        while a buffer after the stage fills and no step has run, has almost no downstream
        time and reads as a huge R: ``hasten echo`` measured R 541 in its first window behind
        a buffer sized for ``e_max``, and e started (and, at R 3.5, stayed) at ``e_max``.
        ``hasten.stream.echo_stage.EchoStage`` calls it."""
        with self._lock:
            self._loop_reports = True

    def record_step(self, wait_s: float, step_s: float, items: int) -> None:
        """The training loop's report of one step: seconds it waited for the batch,
        seconds of its own work, items in the batch. When a loop reports, its items and
        time replace the echo stage's emitted items and downstream time in ``observe``: a
        shuffle buffer that is still filling cannot inflate them. The fresh items of a
        window in which the loop took no step count in the window whose steps take them."""
        with self._lock:
            self._loop[0] += items
            self._loop[1] += wait_s
            self._loop[2] += step_s

    def observe(self, fresh: int, emitted: int, wait_s: float, downstream_s: float) -> float:
        """Take one window's measurements, update and return the echo factor.

        ``fresh`` items came in and ``emitted`` went out; the stage waited ``wait_s`` on
        upstream and downstream took ``downstream_s`` (less time inside ``paused()``).

        - The first window (start-up) is ignored; a window with no fresh or emitted items
          or no downstream time teaches nothing and is skipped.
        - Input-bound when wait / (wait + downstream) > ``idle_threshold``: the upstream is
          then busy the whole window, one fresh item takes (wait + downstream) / fresh and
          one emitted item downstream / emitted, so R = (emitted / fresh) x (1 + wait /
          downstream).
        - The first measured R sets e = R x (1 + ``headroom``) directly; later estimates
          are smoothed (``smoothing``) and e at most doubles per window, so one window's
          outlier (a stall while a buffer grows) cannot throw e to ``e_max``.
        - An R within half the headroom above the e in use holds e: that is the jitter the
          headroom absorbs, not a higher R.
        - A window without waiting says R <= e, the factor in use (the upstream kept up with
          e copies per fresh item): the estimate comes down to at most e, then eases down by
          ``probe`` / 2, so that, if R fell, waiting and a fresh measurement return.
        - e = 1 while the estimate is below ``off_below``; e never exceeds ``e_max`` or the
          cap of ``observe_loss``.
        """
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
        with self._lock:
            dots = tuple(self._dots)
        estimate, self.cap, loss_ratio, (repeat_dot, fresh_dot, reports) = self._agree(
            estimate, self.cap, self.loss_ratio, dots)
        if not math.isnan(loss_ratio):
            self.value_ratio = min(1.0, max(0.0, loss_ratio))
        if reports >= self.value_after and fresh_dot > 0:
            self._set_measured_value(repeat_dot / fresh_dot)
        if self._measured and not math.isnan(estimate) and estimate < self.factor * (1 + self.headroom / 2):
            # (The ranks' agreed estimate against the factor they share: every rank holds.)
            # A short wait at the factor in use (at most half the headroom): the jitter the
            # headroom is there to absorb, not a higher R. Taken as a measurement it gives
            # an R a little above e, hence e x (1 + headroom) above that, window after
            # window, until e reaches e_max (mean e 7.1 at R 5.5 in the echo sweep,
            # docs/echo.md); copies above R add steps without removing waiting. Hold e.
            self.history.append((self.factor, estimate))
            return self.factor
        if math.isnan(estimate):
            # Not waiting: the upstream kept up with e copies per fresh item, so R <= e; an
            # estimate above e (a distorted first window) comes down to e at once, not by 5%
            # a window from wherever it was. Then lower it a little so that, if R has
            # fallen, waiting reappears and measures it again.
            below = self.factor / (1.0 + self.headroom)
            known = below if self.ratio_estimate is None else min(self.ratio_estimate, self.factor)
            self.ratio_estimate = known * (1 - self.probe / 2)
        elif self.ratio_estimate is None or not self._measured:
            self.ratio_estimate = estimate  # the first measurement, not eased guesses, sets R
        else:
            self.ratio_estimate += self.smoothing * (estimate - self.ratio_estimate)
        # The first measured R sets e directly (docstring); later, at most doubling
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
        (or a few); update and return the cap on e.

        While repeats track fresh data the losses agree. The running ratio of the loss
        on repeats to the loss on fresh items (``loss_smoothing``) scales what a repeat is
        worth while it is below 1 (``copy_value``). More than ``repeat_tolerance`` below
        1, the repeats are being memorised: at each window the cap on e comes down to
        ``min(cap, e) x (1 - probe)``; above 1 - ``repeat_tolerance`` / 2 it rises by a
        factor 1 + ``probe`` again, up to ``e_max``. Without loss reports the cap is
        ``e_max``."""
        if not (math.isfinite(fresh_loss) and math.isfinite(repeat_loss)) or fresh_loss <= 0:
            return self.cap
        ratio = repeat_loss / fresh_loss
        if self.loss_ratio is None:
            self.loss_ratio = ratio
        else:
            self.loss_ratio += self.loss_smoothing * (ratio - self.loss_ratio)
        return self.cap

    def report_repeat_gradients(self, repeat_dot: float, fresh_dot: float) -> None:
        """One measurement of what a repeat is worth, from ``hasten.echo.repeat_value.gradient_dots``
        on a batch that holds first copies and repeats: ``repeat_dot`` = g_repeats . g_fresh
        and ``fresh_dot`` = g_fresh_a . g_fresh_b (two disjoint halves of the first copies).
        Their ratio of sums estimates E[g_repeat] . grad L / |grad L|^2, a repeat's share of a
        fresh example's first-order progress. From ``value_after`` reports on (summed over
        the ranks), every repeat is worth that ratio (clipped to [0.05, 1]) in place of
        ``repeat_value`` and ``later_repeat_value``, updated at each window."""
        if not (math.isfinite(repeat_dot) and math.isfinite(fresh_dot)):
            return
        with self._lock:
            keep = self.value_memory
            self._dots = [keep * self._dots[0] + repeat_dot, keep * self._dots[1] + fresh_dot, self._dots[2] + 1]

    def _set_measured_value(self, ratio: float) -> None:
        # One value for every repeat: the measurement does not tell copy 1 from later ones.
        value = min(1.0, max(0.05, ratio))
        self.repeat_value = self.later_repeat_value = value
        self.repeat_decay = math.inf
        self.value_history.append(value)

    @property
    def measured_value(self) -> float | None:
        """The agreed measured value of a repeat in use, or None before ``value_after`` reports."""
        return self.value_history[-1] if self.value_history else None

    def copy_value(self, copy: int) -> float:
        """What copy number ``copy`` of an example (0: the first) is worth next to a
        fresh example: ``repeat_value`` for copy 1, ``later_repeat_value x exp(-(copy - 2)
        / repeat_decay)`` after, times the ranks' agreed loss ratio of repeats to first
        copies while that is below 1. Wall time per unit of progress at factor e is
        max(e x step, upstream time) / (the e copies' values): any positive value keeps e
        at about R, so these values set the steps an echoed run takes, not e."""
        if copy <= 0:
            return 1.0
        if copy == 1:
            return self.repeat_value * self.value_ratio
        return self.later_repeat_value * math.exp(-(copy - 2) / self.repeat_decay) * self.value_ratio

    def emitted(self, copy: int) -> None:
        """The echo stage's record of one emitted item, copy number ``copy``."""
        self._push(self.copy_value(copy), 1)

    def emitted_copies(self, copies: int, items: int = 1) -> None:
        """The echo stage's record of ``copies`` copies of one example (numbers 0 to
        copies - 1), in the order it emits them; of a run of ``items`` batches echoed
        together (``echo_batches(..., group=items)``), each copy ``items`` long."""
        self._push(1.0, items)
        for k in range(1, copies):
            self._push(self.copy_value(k), items)

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
        """Create AutoEcho's own gloo process group. Call it on the training thread of
        every rank, at the same point, before an echo stage runs on another thread
        (``hasten.stream.echo_stage.EchoStage`` does); a no-op without ``torch.distributed``, with ``sync=False``
        or when done already.

        Why: the ranks agree inside the echo stage, on whatever thread runs it. From a
        thread other than the training thread, a collective on the default group would
        interleave with DDP's collectives in an order that differs between ranks (NCCL
        then hangs or mixes tensors); DDP never uses this group, and it reduces CPU
        tensors."""
        if self.sync and self._group is None and self._distributed() is not None:
            self._group = dist.new_group(backend="gloo")

    def _agree(self, estimate: float, cap: float, loss_ratio: float | None,
               dots: tuple[float, float, int] = (0.0, 0.0, 0)) -> tuple[float, float, float, tuple[float, float, int]]:
        """The mean estimate over data-parallel ranks (nan, i.e. 'not input-bound', only if
        no rank waits), the mean cap, the mean loss ratio (nan if no rank has one) and the
        sums of the repeat-value reports, so that every rank computes the same e and values
        repeats alike."""
        loss = math.nan if loss_ratio is None else loss_ratio
        if not self.sync or self._distributed() is None:
            return estimate, cap, loss, dots
        group = self._group
        backend = dist.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        valid, has_loss = not math.isnan(estimate), not math.isnan(loss)
        t = torch.tensor([estimate if valid else 0.0, 1.0 if valid else 0.0, cap,
                          loss if has_loss else 0.0, 1.0 if has_loss else 0.0, *dots],
                         device=device, dtype=torch.float64)
        dist.all_reduce(t, group=group)
        world = dist.get_world_size(group)
        return ((math.nan if t[1] == 0 else float(t[0] / t[1])), float(t[2] / world),
                (math.nan if t[4] == 0 else float(t[3] / t[4])), (float(t[5]), float(t[6]), int(t[7])))

    def __repr__(self) -> str:
        return f"AutoEcho(factor={self.factor:.2f}, e_max={self.e_max})"
