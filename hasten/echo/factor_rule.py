"""How AutoEcho moves its echo factor: from the run's evidence of R, not from one window.

hasten's own (``hasten.echo.auto.AutoEcho`` holds one ``FactorRule``). The idea it rests on
is queueing's: behind a prefetch buffer the consumer's throughput is set by the producer's
*long-run* rate; a burst (a whole shard arriving at once, then a gap) costs only what the
buffer fails to absorb. Near R = 1 such waits come from the arrivals' variability, not
from a shortfall: a queue's mean wait grows as rho / (1 - rho) times the variability of
arrivals and service (Kingman, "The single server queue in heavy traffic", 1961), so a
loop waits a little at any R near 1 and at any e near R. Measured on the real source
(docs/results/echo-link.md, issue 44): at a nominal R of 1 the loop waited 6-9% of the
time at e = 1, and windows of four steps read R above 1.25 often enough for the median of
three to echo. What decides whether a copy pays is the sustained ratio, so R^ pools the
windows:

    reading of a window    (emitted / fresh) x (1 + wait / downstream) if it waited,
                           e if it did not (the upstream kept up: R <= e)
    R^                     the mean of the readings of the last ``horizon`` windows at the
                           current e, without the largest (at least two windows)

Each window holds the same number of fresh items at the same e, so the mean of the readings
is the run's ratio of time to downstream time over those windows, the long-run R a prefetch
buffer sees; windows without waiting count at e and dilute the bursts. The largest reading
is left out so that one burst, however long, cannot move e alone (a leave-one-out decision,
as a trimmed mean is robust to one outlier; Tukey, 1962). Then:

- e = 1 (off) turns on only when R^ >= ``off_below``: a burst over two windows reads as
  their smaller one, a burst among sixteen windows as a sixteenth of its wait.
- e moves up to R^ when R^ > e x (1 + ``hysteresis``). At e = R the loop still waits on
  bursts; their share must pass the band over the pooled windows, not in one window, so e
  does not climb above R on them. It moves down only when the mean without the smallest
  reading is below e x (1 - ``hysteresis``) (a window right after a rise, whose items a
  growing shuffle buffer holds back, reads low): robust to one bad reading either way.
- A copy above R only adds steps, and the readings cannot see below e, so it is probed:
  after ``patience`` windows in a row without waiting, e steps down by ``probe`` and the
  pool starts again at the new e. If R^ there brings e back up, the copy was paying and the
  next probe waits twice as long (up to ``MAX_PATIENCE`` windows). If as many quiet windows
  follow, the copy bought nothing and e steps down again, the next time after half as
  many (down to 2). Not after one quiet window: after a probe below R the buffer the
  surplus filled drains first, and the loop waits only then. A probe whose windows wait
  but leave R^ within the band found e at R: the copy was paying, likewise.

``factor`` here is AutoEcho's base, its estimate of R; the e it runs is the base with its
headroom (``hasten.echo.auto``), without it while a probe is pending (``probing``): a
probe tests the base, and a window that does not wait counts as the base.

Changes the training math: no (it decides e; see ``hasten.echo.auto`` for what e changes).
"""

from __future__ import annotations

import math
from collections import deque

# Windows pooled in R^ (at one e): 16 windows of the recipes' 4 batches are 64 steps, many
# times what a loader's read-ahead and shuffle buffer hold. (With 8, a modelled stall of 7
# windows at R = 1, tests/test_echo_auto_bursts.py, turned echoing on for two windows.)
HORIZON = 16
# Windows without waiting before a probe one step lower, at most (doubled after each probe
# that found the copy paying, from 2).
MAX_PATIENCE = 16


class FactorRule:
    """The decision of the echo factor from one reading per window (module docstring)."""

    def __init__(self, *, probe: float, hysteresis: float, off_below: float, horizon: int = HORIZON):
        self.probe = probe
        self.hysteresis = hysteresis
        self.off_below = off_below
        self.readings: deque[float] = deque(maxlen=horizon)  # at the current e
        self.estimate: float | None = None  # R^
        self.slack = 0  # windows without waiting in a row
        self.patience = 2  # windows without waiting before the next probe
        self.probing = False  # e was lowered by a probe whose verdict is pending
        self.probes = 0

    def pooled(self) -> tuple[float, float] | None:
        """The mean of the readings without the largest (R^) and without the smallest: one
        reading alone before a second; None before any."""
        if len(self.readings) < 2:
            return (self.readings[0],) * 2 if self.readings else None
        total, rest = sum(self.readings), len(self.readings) - 1
        return (total - max(self.readings)) / rest, (total - min(self.readings)) / rest

    def decide(self, factor: float, estimate: float) -> float | None:
        """Take one window's R (``estimate``; nan: it did not wait) at ``factor``; the e to
        move to, or None to hold."""
        waited = not math.isnan(estimate)
        self.readings.append(estimate if waited else factor)
        self.slack = 0 if waited else self.slack + 1
        pooled = self.pooled()
        if pooled is not None:
            self.estimate = pooled[0]
        if len(self.readings) < 2:
            pooled = None  # one window decides nothing
        if factor <= 1.0:
            # Off: on only when the pooled evidence says the shortfall is sustained.
            return pooled[0] if pooled is not None and pooled[0] >= self.off_below else None
        if pooled is not None:
            low, high = pooled
            if low > factor * (1 + self.hysteresis):
                if self.probing:
                    # The copy the probe removed was paying: back to R, the next probe later.
                    self.probing = False
                    self.patience = min(2 * self.patience, MAX_PATIENCE)
                return low
            if high < factor * (1 - self.hysteresis):
                return high
        if self.probing and len(self.readings) >= self.patience and self.slack < len(self.readings):
            # The loop waits at the probe's e, but R^ stays within the band: e is at R, the
            # copy the probe removed was paying (AutoEcho puts its headroom back on).
            self.probing = False
            self.patience = min(2 * self.patience, MAX_PATIENCE)
            return None
        if waited or self.slack < self.patience:
            return None
        if self.probing:
            # The last probe's copy bought nothing over as many quiet windows as it waited
            # for: the next probe comes sooner.
            self.patience = max(2, self.patience // 2)
        self.probing = True
        self.probes += 1
        self.estimate = factor * (1 - self.probe)
        return self.estimate

    def moved(self) -> None:
        """e changed: the readings at the old e say nothing of the new one's waiting."""
        self.readings.clear()
        self.slack = 0
