"""Means, spreads and 95% intervals for every benchmark and report, defined once.

Why one module with the exact quantile: a t table that stops at some degrees of freedom
and uses the normal's 1.96 beyond makes small-sample intervals too narrow (1.96 in place
of t = 2.228 at n = 11: 12%), and two copies give two answers to one question. Here the
quantile is exact at every df, so every table that reports "mean ± 95% interval" agrees.

- ``mean``, ``sample_std``: None entries are skipped (a run that never reached its
  target has no time to it). The sample standard deviation (n - 1 in the denominator)
  of fewer than two values is None, not 0: one value says nothing about the spread.
- ``t_quantile(p, df)``: Student's t quantile. Its upper tail is half the regularized
  incomplete beta function I_x(df/2, 1/2) at x = df / (df + t^2), computed with the
  continued fraction of Abramowitz & Stegun 26.5.8 (modified Lentz method, Numerical
  Recipes 6.4) and inverted by bisection. Above 1000 degrees of freedom, where the continued fraction
  needs ~sqrt(df) terms and the log-gamma terms lose digits, the Cornish-Fisher series
  around the normal quantile (A&S 26.7.5, to 1/df^4). Either way within 1e-11 (relative)
  of the exact quantile for p up to 1 - 1e-8 (checked against 40-digit arithmetic).
- ``mean_ci``: mean, sample std, n, the half-width of the mean's two-sided 95%
  interval, t(0.975, n - 1) s / sqrt(n), and the values it came from.
- ``describe``: the short form (mean, std, n) of report rows.
- ``paired``, ``paired_differences``, ``paired_ratios``: two conditions measured on the
  same seeds, rounds or repeats, matched before they are compared, so that what the pair
  shares (the seed, the machine's load at the time) cancels.

scipy is not a dependency of hasten; nothing here needs it.

Changes the training math: no (reporting only).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["mean", "sample_std", "t_quantile", "describe", "mean_ci", "paired", "paired_differences",
           "paired_ratios"]

# Above this many degrees of freedom the quantile comes from the Cornish-Fisher series:
# its first omitted term, ~1/df^5, is below 1e-12 there, while the incomplete beta's
# log-gamma terms (~df log df) start to cost more than that in rounding.
_LARGE_DF = 1000


def _present(values: Iterable) -> list[float]:
    return [float(v) for v in values if v is not None]


def mean(values: Iterable) -> float | None:
    """The arithmetic mean of the values that are not None; None when there are none."""
    xs = _present(values)
    return math.fsum(xs) / len(xs) if xs else None


def sample_std(values: Iterable) -> float | None:
    """The sample standard deviation (n - 1 in the denominator) of the values that are
    not None; None below two values (undefined: one value has no spread to measure)."""
    xs = _present(values)
    if len(xs) < 2:
        return None
    m = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# ----------------------------------------------------------------------------- Student's t
def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Numerical Recipes 6.4,
    modified Lentz); converges quickly for x < (a + 1) / (a + b + 2)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def _incomplete_beta(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function I_x(a, b), with y = 1 - x passed in (the
    caller has it without the cancellation of 1 - x)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log(y) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, y) / b


def _t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0: half of I_x(df / 2, 1 / 2) at x = df / (df + t^2)."""
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def _bisect_upper(tail_of, tail: float) -> float:
    """The x >= 0 with tail_of(x) = tail, for tail_of decreasing from 1/2 at 0."""
    lo, hi = 0.0, 1.0
    while tail_of(hi) > tail:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi) or hi - lo <= 1e-13 * hi:
            break
        if tail_of(mid) > tail:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, Student's t with ``df`` degrees of freedom: exact (within
    1e-11, relative) at every df > 0, integer or not; df = inf gives the normal quantile.
    The two-sided 95% interval of a mean over n values uses ``t_quantile(0.975, n - 1)``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1); got {p}")
    if not df > 0:  # NaN too
        raise ValueError(f"degrees of freedom must be > 0; got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    tail = 1.0 - p
    if tail == 0.5:
        return 0.0
    if df > _LARGE_DF:  # includes inf, where every term but z is 0
        z = _bisect_upper(lambda x: 0.5 * math.erfc(x / math.sqrt(2.0)), tail)
        g1 = (z ** 3 + z) / 4
        g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
        g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
        g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
        return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4
    return _bisect_upper(lambda x: _t_upper_tail(x, df), tail)


# ----------------------------------------------------------------------------- Summaries
def describe(values: Iterable) -> dict:
    """``{"mean", "std", "n"}`` of the values that are not None (``sample_std``: None below two)."""
    xs = _present(values)
    return {"mean": mean(xs), "std": sample_std(xs), "n": len(xs)}


def mean_ci(values: Iterable) -> dict:
    """``{"n", "mean", "std", "ci95", "values"}`` of the values that are not None: the
    mean, the sample standard deviation, and the half-width of the mean's two-sided 95%
    interval, ``t_quantile(0.975, n - 1) * std / sqrt(n)``. std and ci95 are None below
    two values; mean too for none. The values travel with the interval, so that a
    reader can recompute it."""
    xs = _present(values)
    n, std = len(xs), sample_std(xs)
    ci95 = t_quantile(0.975, n - 1) * std / math.sqrt(n) if std is not None else None
    return {"n": n, "mean": mean(xs), "std": std, "ci95": ci95, "values": xs}


# ----------------------------------------------------------------------------- Pairs
def paired(a: Mapping | Sequence, b: Mapping | Sequence) -> list[tuple[float, float]]:
    """``(a's value, b's value)`` for every unit both measured: mappings (seed, round,
    repeat -> value) pair by key, in a's order, keys only one has are left out;
    sequences pair by position and must be equally long."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [(a[k], b[k]) for k in a if k in b]
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        raise TypeError("paired: pass two mappings (pairs by key) or two sequences (pairs by position)")
    if len(a) != len(b):
        raise ValueError(f"paired: sequences pair by position and must be equally long; got {len(a)} and {len(b)}")
    return list(zip(a, b))


def paired_differences(a: Mapping | Sequence, b: Mapping | Sequence) -> list[float]:
    """a - b for each pair (``paired``): e.g. accuracy on the same seed with and without a change."""
    return [x - y for x, y in paired(a, b)]


def paired_ratios(a: Mapping | Sequence, b: Mapping | Sequence) -> list[float]:
    """a / b for each pair (``paired``): e.g. the speed-up of one pipeline over another in the same round."""
    return [x / y for x, y in paired(a, b)]
