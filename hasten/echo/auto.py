"""AutoEcho: an echo factor that follows the measured input bottleneck while training.

Based on: Choi et al., "Faster Neural Network Training with Data Echoing" (2019,
arXiv:1907.05550): with R = upstream time / downstream time, echoing up to e = R costs
no wall time per step. The paper sets e by hand; AutoEcho (hasten's own) measures R
while training and follows it. Pass it wherever an echo factor is accepted.

The rule, once per window of ``interval`` fresh items (``observe`` has it in full):

    R = (emitted / fresh) x (1 + wait / downstream)    a window in which the echo stage waits
    R^ = the mean over the last 16 windows at this     (a window without waiting counts as the
         base, without the largest                     base; one burst moves nothing)
    base = R^ when R^ leaves base x (1 +- hysteresis); 1 while R^ < off_below
    e = min(e_max, cap, value_bound, base x (1 + headroom)),  headroom = min(1/2, 2v - 1)

Below R a copy removes waiting; above R it costs a step only what a repeat v is worth less
than a fresh example, and it absorbs the upstream's bursts, which make a loop at e = R wait:
so e runs above the base by a headroom that the run's own measurement of v grants (none
before v is measured or where v <= 1/2; ``headroom``). Behind a prefetch buffer only a
sustained shortfall of the upstream costs time, so R^ pools the run's windows rather than
reading one (``hasten.echo.factor_rule``, where the reasoning and its sources are). Whether
the base still stands is measured, not assumed: after a few windows without waiting, e drops
its headroom and steps down by ``probe``; if the loop then waits, the copy was paying (the
headroom comes back; the next probe waits twice as long); if not, e keeps stepping down. The
cap comes down while the loss on repeats falls below the loss on fresh items
(``observe_loss``: the repeats are being memorised), and e stays within ``value_bound``, set
by what a repeat is worth as measured from the run's gradients (``report_repeat_gradients``,
``hasten.echo.repeat_value.RepeatValueEstimate``). Under ``torch.distributed`` the ranks
agree on one e. AutoEcho needs an upstream that runs concurrently (DataLoader workers, a
prefetch thread), as any real input pipeline has.

The training schedule is the loop's own, in steps, as with a fixed factor: a step counts as
a step whatever share of its batch is repeats (issue 44). Until then AutoEcho ran the
schedule on *effective examples*, a repeat counting its measured first-order value v
(g_repeat . grad L / |grad L|^2), which stretched an echoed run's schedule by
1 / (1/e + (1 - 1/e) v). Why a step, not v:

- The evidence. Through hasten's whole pipeline on CIFAR-10-JPEG the fixed factors e = 1, 2
  and 4 reached 75% in the same steps (684-733 of 977), at v 0.53-0.69; AutoEcho's
  stretched schedule (its learning rate still high where e = 4's had decayed) took 791-832
  steps, at 0.60 to 0.79 of the best fixed factor's speed.
- The theory does not make v the value of a step. In the large-batch model of McCandlish
  et al. (arXiv:1812.06162), at the learning rate best for fresh batches a batch of mean
  gradient m G (m = 1/e + (1 - 1/e) v) is worth m (2 - m) of a fresh step when curvature
  limits the step (0.93 at e = 4, v = 0.65) and 2m - 1 when noise does (0.48 there): the
  value of a step depends on the noise scale and on where lr stands against its optimum,
  which the schedule does not know. The measured steps fit the curvature-limited end.
- The paper keeps the training algorithm and each run's own step budget (Choi et al.).

What the measured v still decides is how far e may go (``value_bound``): by the same model,
a step with repeats makes progress even where noise limits it only while 2m - 1 > 0 (m > 1/2), so
e stays within 2 (1 - v) / (1 - 2 v) when v < 1/2 (repeats mostly memorised: e <= 2 at
v = 0) and is not bounded by it when v >= 1/2. The loss cap guards the same thing from the
loss; the schedule never moves.

Changes the training math: yes, as echoing does (examples are repeated); e depends on timing,
so runs are not bit-reproducible. The schedule is untouched.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

from hasten.echo.factor_rule import FactorRule
from hasten.echo.ranks import agree, own_group
from hasten.echo.repeat_value import RepeatLossSums, RepeatValueEstimate
from hasten.timing import Stopwatch

# What a repeat is worth next to a fresh example before the run has measured it (the prior
# ``RepeatValueEstimate`` shrinks toward): the first repeat's value in the least-squares fit
# of benchmarks/echo_repeat_value.py on a CIFAR-10-JPEG subset held out from the echo sweep.
# Above 1/2, so ``value_bound`` bounds nothing until the run's own gradients say otherwise.
REPEAT_VALUE = 0.57
# The most e runs above R^ (``AutoEcho.headroom``): half again, reached at a measured
# repeat value of 3/4. e = 2R (e = 4 at R = 2) cost no steps against the real source.
HEADROOM = 0.5


RULE_FILES = ("auto.py", "factor_rule.py", "ranks.py", "repeat_value.py")


def rule_digest() -> str:
    """A digest of the source of AutoEcho's rule (this module and the three it is built from):
    run journals key AutoEcho's runs on it; a changed rule reruns them, not the others."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parent
    text = b"".join((here / name).read_bytes() for name in RULE_FILES)
    return hashlib.sha256(text).hexdigest()[:16]


class AutoEcho:
    """An echo factor that updates itself; pass it wherever a factor is accepted.

    With ``torch.distributed`` initialised (and ``sync``), the R estimate, the cap and the
    repeat-value reports are combined over the ranks at every window, so that all ranks use
    one e and value repeats alike; see ``setup_distributed``.

    ``e_max``: upper bound on e. ``interval``: fresh items per measurement window.
    ``idle_threshold``: waiting share above which the pipeline counts as
    input-bound. ``probe``: relative step down of e that tests whether its top copy pays.
    ``hysteresis``: e moves to R^ only when R^ leaves e x (1 +- hysteresis) (waiting that
    small is the upstream's jitter). ``off_below``: estimated R under which echoing stays
    off (timing noise alone can suggest R = 1.1; echoing that little gains little and
    costs fresh data). ``repeat_tolerance``: relative loss gap (fresh minus repeats) beyond
    which repeats count as memorised and the cap on e comes down.
    ``loss_smoothing``: weight of each step's losses in the running loss ratio.
    ``repeat_value``: what a repeat is worth next to a fresh example before it is measured
    (``value_bound``; the default is measured on CIFAR-10-JPEG, ``benchmarks/echo_repeat_value.py``).
    A loop that measures when ``value_due()`` says so and reports
    ``hasten.echo.repeat_value.gradient_dots`` (``report_repeat_gradients``) has the value
    measured on its own task while it trains; ``repeat_value`` is then the prior it is
    shrunk toward. ``value_every``: steps between measurements at first (it grows once the
    value stands; 0: never measure).
    The first window is ignored: it holds the pipeline's start-up.
    """

    def __init__(
        self,
        e_max: float = 8.0,
        *,
        interval: int = 64,
        idle_threshold: float = 0.02,
        probe: float = 0.1,
        hysteresis: float = 0.05,
        off_below: float = 1.25,
        repeat_tolerance: float = 0.1,
        loss_smoothing: float = 0.05,
        repeat_value: float = REPEAT_VALUE,
        value_every: int = 8,
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
        if not 0 <= hysteresis < 1:
            raise ValueError(f"AutoEcho hysteresis must be in [0, 1); got {hysteresis!r}")
        if not 0 < repeat_tolerance < 1:
            raise ValueError(f"AutoEcho repeat_tolerance must be in (0, 1); got {repeat_tolerance!r}")
        if not 0 < loss_smoothing <= 1:
            raise ValueError(f"AutoEcho loss_smoothing must be in (0, 1]; got {loss_smoothing!r}")
        if not (isinstance(repeat_value, (int, float)) and 0 < repeat_value <= 1):
            raise ValueError(f"AutoEcho repeat_value must be in (0, 1] (of a fresh example); got {repeat_value!r}")
        if not (isinstance(value_every, int) and value_every >= 0):
            raise ValueError(f"AutoEcho value_every must be an integer >= 0 (steps); got {value_every!r}")
        self.e_max = float(e_max)
        self.prior_value = float(repeat_value)  # the prior the measured value is shrunk toward
        self.repeat_value = self.prior_value  # what a repeat is worth: the measurement, shrunk
        self.value = RepeatValueEstimate(value_every)
        self._pending_dots = [0.0, 0.0, 0]  # reports since the last window (report_repeat_gradients)
        self.value_history: list[float] = []  # a repeat's value after each block that moved it
        self.repeat_losses = RepeatLossSums(self.observe_loss)  # observe_repeat_losses sums here
        self._measured = False  # whether e has left 1 (the first move goes straight to R^)
        self._group = None  # AutoEcho's own process group (setup_distributed)
        self._lock = threading.Lock()  # record_step may run on another thread than observe
        self.repeat_tolerance = repeat_tolerance
        self.loss_smoothing = loss_smoothing
        self.cap = float(e_max)  # the largest e repeats are still worth (lowered by observe_loss)
        self.loss_ratio: float | None = None  # running mean of (loss on repeats) / (loss on fresh items)
        self.interval = interval
        self.idle_threshold = idle_threshold
        self.probe = probe
        self.hysteresis = hysteresis
        self.off_below = off_below
        self.sync = sync
        self.factor = 1.0
        self.base = 1.0  # R^ as the rule last set it; e is the base with its headroom
        self.rule = FactorRule(probe=probe, hysteresis=hysteresis, off_below=off_below)
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
          downstream). A window that does not wait reads R <= e, and counts as e.
        - R^ is the mean of the last 16 windows' readings at the current e without the
          largest (``hasten.echo.factor_rule``), from two windows on; e moves to R^ only
          when R^ is more than ``hysteresis`` away from it, at most doubling per window
          after the first move. At e = 1, echoing turns on only when R^ >= ``off_below``.
        - After ``patience`` windows in a row without waiting (2 at first), a probe: e
          steps down by ``probe`` and the pooled windows start again. A probe that R^
          brings back up found the copy paying: ``patience`` doubles (up to 16), so a
          settled e is probed rarely; two quiet windows after a probe found it useless:
          ``patience`` goes back to 2 and e keeps stepping down until the loop waits.
        - e = 1 while R^ is below ``off_below``; e never exceeds ``e_max`` or the cap of
          ``observe_loss``.
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
            dots, self._pending_dots = tuple(self._pending_dots), [0.0, 0.0, 0]
        estimate, self.cap, dots = self._agree(estimate, self.cap, dots)
        if dots[2] and self.value.add(*dots):
            self.repeat_value = self.value.shrunk(self.prior_value)
            self.value_history.append(self.repeat_value)
        self.history.append((self.factor, estimate))
        # (The ranks' agreed estimate against the factor they share: every rank decides alike.)
        target = self.rule.decide(self.base, estimate)
        bound = min(self.cap, self.value_bound)
        if target is not None:
            if target < self.off_below:
                self.base = 1.0
            else:
                step_limit = 2 * self.base if self._measured else self.e_max  # one outlier cannot reach e_max
                self.base = max(1.0, min(self.e_max, step_limit, target))
        self.base = min(self.base, max(1.0, bound))  # the cap or the value bound came down: the base follows
        new = self.base if self.base <= 1.0 or self.rule.probing else self.base * (1.0 + self.headroom)
        new = max(1.0, min(self.e_max, bound, new))
        if target is None and self.factor <= bound and abs(new - self.factor) <= self.hysteresis * self.factor:
            return self.factor  # the headroom moved within the band (its value is re-measured): hold
        self._measured = self._measured or new > 1.0
        if new != self.factor:
            self.rule.moved()
        self.factor = new
        return new

    @property
    def headroom(self) -> float:
        """The share by which e runs above the base: 2v - 1 of the *measured* value v of a
        repeat, at most ``HEADROOM``; 0 before v is measured and where v <= 1/2 (module
        docstring; ``value_bound`` takes over below 1/2)."""
        v = self.measured_value
        return 0.0 if v is None else min(HEADROOM, max(0.0, 2 * v - 1))

    @property
    def ratio_estimate(self) -> float | None:
        """R^ (``hasten.echo.factor_rule``; the one reading at this e before a second, which
        alone moves nothing), None before any."""
        return self.rule.estimate

    @property
    def value_bound(self) -> float:
        """The largest e at which a step's batch keeps a first-order value m = 1/e + (1 - 1/e) v
        above 1/2 (v: ``repeat_value``): 2 (1 - v) / (1 - 2 v) for v < 1/2, else inf. Below
        that a step with repeats makes progress even where gradient noise limits it (2m - 1
        of a fresh step's, module docstring); above it, in that regime, it would not."""
        v = self.repeat_value
        return math.inf if v >= 0.5 else 2 * (1 - v) / (1 - 2 * v)

    @property
    def probes(self) -> int:
        """Probes taken: steps down of e that tested whether its top copy paid."""
        return self.rule.probes

    def observe_loss(self, fresh_loss: float, repeat_loss: float, steps: int = 1) -> float:
        """Take the mean training loss on first copies and on repeats over ``steps``
        steps; update and return the cap on e.

        While repeats track fresh data the losses agree. When the running ratio of the loss
        on repeats to the loss on fresh items (``loss_smoothing``) is more than
        ``repeat_tolerance`` below 1, the repeats are being memorised: at each window the
        cap on e comes down to ``min(cap, e) x (1 - probe)``; above 1 - ``repeat_tolerance``
        / 2 it rises by a factor 1 + ``probe`` again, up to ``e_max``. Without loss reports
        the cap is ``e_max``."""
        if not (math.isfinite(fresh_loss) and math.isfinite(repeat_loss)) or fresh_loss <= 0:
            return self.cap
        ratio = repeat_loss / fresh_loss
        if self.loss_ratio is None:
            self.loss_ratio = ratio
        else:  # as ``steps`` reports of one step each
            self.loss_ratio += (1 - (1 - self.loss_smoothing) ** steps) * (ratio - self.loss_ratio)
        return self.cap

    def value_due(self, free: bool = True) -> bool:
        """Once per step: whether to measure a repeat's worth (``gradient_dots``, then
        ``report_repeat_gradients``); never at e = 1; as ``RepeatValueEstimate.due`` says.
        ``free``: the loop waits for input (a measurement then costs it no time)."""
        return self.factor > 1.0 and self.value.due(free)

    def report_repeat_gradients(self, repeat_dot: float, fresh_dot: float) -> None:
        """One measurement of what a repeat is worth, from ``hasten.echo.repeat_value.gradient_dots``
        on a batch that holds first copies and repeats: ``repeat_dot`` = g_repeats . g_fresh
        and ``fresh_dot`` = g_fresh_a . g_fresh_b (two disjoint halves of the first copies).
        At the next window the reports of all ranks go into ``RepeatValueEstimate`` (blocks of
        reports, their median, shrunk toward ``repeat_value``'s prior by its standard error),
        which sets ``value_bound``."""
        if not (math.isfinite(repeat_dot) and math.isfinite(fresh_dot)):
            return
        with self._lock:
            pending = self._pending_dots
            pending[0] += repeat_dot
            pending[1] += fresh_dot
            pending[2] += 1

    @property
    def measured_value(self) -> float | None:
        """A repeat's value from the measurement (shrunk toward the prior), or None before
        the measurement counts (``RepeatValueEstimate.MIN_BLOCKS`` blocks)."""
        return self.value_history[-1] if self.value_history else None

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

    def setup_distributed(self) -> None:
        """Create AutoEcho's own gloo process group (``hasten.echo.ranks.own_group``). Call it
        on the training thread of every rank, at the same point, before an echo stage runs on
        another thread (``hasten.stream.echo_stage.EchoStage`` does); a no-op without
        ``torch.distributed``, with ``sync=False`` or when done already."""
        if self.sync and self._group is None:
            self._group = own_group()

    def _agree(self, estimate: float, cap: float,
               dots: tuple[float, float, int] = (0.0, 0.0, 0)) -> tuple[float, float, tuple[float, float, int]]:
        if not self.sync:
            return estimate, cap, dots
        return agree(self._group, estimate, cap, dots)

    def __repr__(self) -> str:
        return f"AutoEcho(factor={self.factor:.2f}, e_max={self.e_max})"
