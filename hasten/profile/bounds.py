"""The most a fix can give, from the run's own measured shares (Amdahl's law).

A fix removes time from one part of the step (:data:`~hasten.profile.records.INPUT`,
:data:`~hasten.profile.records.COMPUTE` or :data:`~hasten.profile.records.COMMUNICATION`); the
rest of the step stays. So a data fix gives at most T / T_free, T_free the step with its data
made free (:func:`hasten.profile.attribution.data_free_step`, never below what the step's own
CPU allows); a communication fix at most T / (T - exposed communication); a compute fix at
most T / (T - compute). Every prediction passes through :func:`hasten.profile.ranking.admit`,
which holds it to these.

Changes the training math: no (analysis only).
"""

from __future__ import annotations

import math

from hasten.profile.records import COMMUNICATION, COMPUTE, INPUT, Analysis


def amdahl(step: float, removable: float) -> float:
    """The most any fix of a part taking ``removable`` of a step ``step`` can give."""
    rest = step - removable
    return step / rest if rest > 1e-12 else math.inf


def gain_bound(a: Analysis, kind: str) -> float:
    """The most a fix of ``kind`` can give this run, from its measured shares."""
    t = a.step_time_s
    if kind == INPUT:
        free = a.data_free_step_s if a.data_free_step_s is not None else t * (1 - a.data_wait_fraction)
        return amdahl(t, t - free)
    if kind == COMMUNICATION:
        return amdahl(a.own_step_s, a.comm_s)
    if kind == COMPUTE:
        return amdahl(t, t * a.compute_fraction)
    raise ValueError(f"Invalid fix kind {kind!r}; accepted: {INPUT}, {COMPUTE}, {COMMUNICATION}")


def data_gain(a: Analysis) -> tuple[float, float, float]:
    """What making the data free could gain (Amdahl, 1 / (1 - data share)), at the data share and at its
    interval's ends: the estimate never above :func:`gain_bound`, the ends around it."""
    point = gain_bound(a, INPUT)
    lo, hi = a.data_interval
    low = min(point, 1 / max(1e-9, 1 - lo))
    high = max(point, 1 / max(1e-9, 1 - hi))
    fastest = a.cpu.get("fastest_step_s")
    if fastest:  # no faster than the step's own work, as measured (hasten.profile.attribution.fastest_step)
        high = max(point, min(high, a.step_time_s / min(fastest, a.step_time_s * (1 - a.data_wait_fraction))))
    return low, point, high
