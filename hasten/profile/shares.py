"""How well a share of the step is known, and whether that is well enough to decide a verdict.

A share measured over n steps (data wait / step time) is a ratio of two sums; its interval
comes from the steps' spread (the delta method: the standard error of sum(D) / sum(T) is
that of the residuals D_i - r T_i, over the mean step; Student's t for few steps). A share
known from samples (how much of the time outside compute the stack sampler found making
the batch) has Wilson's interval for a binomial proportion. Both are about 95%.

Steps whose compute took over :data:`STALL` times the median step's (:func:`stalled`) are
left out of the shares: on a shared machine, a spell in which other jobs hold the cores
stretches a step's compute tenfold (torch's threads wait at every barrier for the one that
is off its core) while its data wait stays what it was, and a ratio of sums is then the
machine's state, not the loop's.

A share decides a verdict when its interval, widened to at least the dead band either side
of its estimate, is clear of every threshold: :func:`undecided` names the threshold it
straddles. The measured window goes on while that is so and the time bound allows
(:mod:`hasten.profile.inject.phases`), so that two runs of the same script give the same
verdict; one that ends undecided is reported as near the line, with its interval.

Standard library only: every instrumented process imports it.

Changes the training math: no.
"""

from __future__ import annotations

import math
import statistics

from hasten.stats import t_quantile


def ratio_interval(parts: list[float], totals: list[float]) -> tuple[float, float, float]:
    """``sum(parts) / sum(totals)`` and its 95% interval, clipped to [0, 1]."""
    n = len(parts)
    total = sum(totals)
    if n == 0 or total <= 0:
        return math.nan, 0.0, 1.0
    r = sum(parts) / total
    if n < 2:
        return r, 0.0, 1.0
    mean_t = total / n
    var = sum((p - r * t) ** 2 for p, t in zip(parts, totals)) / (n - 1)
    half = t_quantile(0.975, n - 1) * math.sqrt(var / n) / mean_t
    return r, max(0.0, r - half), min(1.0, r + half)


def wilson(k: int, n: int) -> tuple[float, float, float]:
    """The proportion ``k / n`` and Wilson's 95% interval; (0.5, 0, 1) with no samples."""
    if n <= 0:
        return 0.5, 0.0, 1.0
    z = 1.96
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def product_interval(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    """The product of two independent non-negative shares, with the product of their bounds (conservative)."""
    return a[0] * b[0], a[1] * b[1], a[2] * b[2]


def sum_interval(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    """The sum of two shares known independently (the data wait's, and the CPU the workers take from the
    step), each ``(estimate, low, high)``: their half-widths add in quadrature, as independent errors do.
    Adding the ends instead gives the chance that both are at their low end together, far below 5%: one
    run of chargpt with 4 workers read 4.8% (4.1%-5.5%) + 3.7% (0.8%-7.8%) as 4.9%-13.3%, `balanced`."""
    point = a[0] + b[0]
    lo = point - math.hypot(a[0] - a[1], b[0] - b[1])
    hi = point + math.hypot(a[2] - a[0], b[2] - b[0])
    return point, max(0.0, lo), min(1.0, hi)


def widened(share: float, lo: float, hi: float, dead_band: float) -> tuple[float, float]:
    """The interval, at least ``dead_band`` either side of the estimate."""
    return min(lo, share - dead_band), max(hi, share + dead_band)


def undecided(share: float, lo: float, hi: float, thresholds: tuple[float, ...], dead_band: float) -> float | None:
    """The threshold that the share's interval (widened to the dead band) straddles, or None."""
    lo, hi = widened(share, lo, hi, dead_band)
    return next((t for t in thresholds if lo < t <= hi), None)


def could_decide(share: float, lo: float, hi: float, thresholds: tuple[float, ...], dead_band: float) -> bool:
    """Whether more steps could take the interval off the threshold it straddles: the estimate is
    outside the dead band around it, or the interval still reaches more than two dead bands past
    the threshold on either side. An estimate inside the dead band is given up on (no number of
    steps decides a share that sits on the line) only once the interval is that narrow: from a
    few dozen stack samples one sample is 4 points, and a loop with no data time at all read
    4.9% (0.9% to 21%) after 20 steps on a loaded machine, where 80 steps read 0.0% (0 to 4.1%)."""
    t = undecided(share, lo, hi, thresholds, dead_band)
    if t is None:
        return False
    return abs(share - t) > dead_band or lo < t - 2 * dead_band or hi > t + 2 * dead_band


STALL = 3.0  # a step whose compute took more than this many times the median step's stalled
STALL_MOST = 1 / 3  # ... unless more steps than this do: then the loop runs that way, and every step counts


def stalled(records: list[dict]) -> list[bool]:
    """Which measured steps stalled: their compute per training forward over ``STALL`` times the
    median step's.

    Another job holding the cores stretches compute (both measured conditions of issue 32's
    benchmark saw steps of 100 ms take 1.5 s in spells), not the data wait: counting those
    steps in a ratio of sums makes the data share of one run a fifth of another's. Per forward
    (``micro``: a step's batches, or without a DataLoader its training forwards), so that an
    episode of a reinforcement-learning loop that runs longer than most is not taken for one.
    A loop whose own steps vary that much in more than a third of them (a long step every
    other one) keeps them all: that is how it runs."""
    comp = [r.get("compute_s") for r in records]
    if len(comp) < 4 or any(c is None for c in comp):
        return [False] * len(comp)
    comp = [c / max(1, r.get("micro") or 1) for c, r in zip(comp, records)]
    line = STALL * statistics.median(comp)
    out = [c > line for c in comp]
    return out if 0 < sum(out) <= STALL_MOST * len(out) else [False] * len(out)
