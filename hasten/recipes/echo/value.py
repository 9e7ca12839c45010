"""What a repeated example is worth, measured: the calibration behind AutoEcho's prior repeat value.

A budget of *effective examples* counts the first copy of an example 1, copy 1 (the
first repeat) ``repeat_value``, copy k >= 2 ``later_repeat_value x exp(-(k - 2) /
repeat_decay)``; AutoEcho ran its schedule on one until issue 44 (it now runs the
loop's schedule in steps, ``hasten.echo.auto``) and keeps the first repeat's value
as the prior of the value it measures. How many steps an echoed run needs rests
on those values, and the sweep showed
that the value borrowed from language-model pre-training (a repeat worth
exp(-1 / 15.4) = 0.94 of a fresh example, Muennighoff et al. 2023) is too high for
image classification under a short schedule: at the baseline's step count every
echo factor from 2 to 8 ended about a point below the baseline
(docs/results/echo.md).

This module measures the values directly, the way the paper measures echoing
(Choi et al., 2019: fresh examples and steps to a target): train at echo factors
``e`` with budgets of ``m`` x the baseline's steps, find for each e the smallest
m at which the echoed runs *reliably* (mean minus one standard deviation over
seeds) end at the baseline's mean accuracy, and fit the two values (no decay) by
least squares on those m: factor e then needs ``e / (1 + first + (e - 2) x later)``
of the baseline's steps. "Reliably" because a budget that only matches the baseline
on average reaches a mean-minus-std target on about half the seeds. Two values,
not one, because the measured step cost was flat in e (about 1.2x at e = 2, 4 and
8): one value per repeat cannot give e = 2 and e = 8 the same steps.

Held out from the echo sweep: another class-balanced training subset
(``subset_seed``) and other seeds; the test images are the same.

Changes the training math: no; it is a measurement.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from hasten.progress import progress
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import load_data
from hasten.recipes.echo.budget import train_budget



def repeat_weight(e: int, first: float, later: float, decay: float = math.inf) -> float:
    """What the repeats of one example at factor e are worth together, in fresh
    examples: ``first`` for copy 1, ``later x exp(-(k - 2) / decay)`` for copy k >= 2."""
    e = int(e)
    if e < 2:
        return 0.0
    return first + later * sum(math.exp(-(k - 2) / decay) for k in range(2, e))


def steps_multiplier(e: int, first: float, later: float, decay: float = math.inf) -> float:
    """The baseline's steps times this: what an echoed run at factor e needs to hold
    the baseline's effective examples, its repeats valued as in ``repeat_weight``."""
    return e / (1.0 + repeat_weight(e, first, later, decay))


def value_for(e: int, multiplier: float) -> float:
    """The one value of every repeat (no decay) at which factor e needs ``multiplier`` x
    the baseline's steps (the inverse of ``steps_multiplier`` with first = later),
    clipped to [0, 1]: a per-factor summary of the measurement."""
    if e < 2:
        raise ValueError(f"a repeat value needs an echo factor >= 2; got {e}")
    if not multiplier > 0:
        raise ValueError(f"multiplier must be > 0; got {multiplier}")
    return min(1.0, max(0.0, (e / multiplier - 1.0) / (e - 1)))


def multiplier_needed(points: list[tuple[float, float]], goal: float) -> float:
    """The step multiplier at which accuracy reaches ``goal``, from (multiplier,
    accuracy) points: linear interpolation between the points around the crossing,
    the smallest multiplier if it is reached there already, a linear extrapolation of
    the last two points if it is reached nowhere (inf if they do not rise)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("multiplier_needed needs at least one point")
    if pts[0][1] >= goal:
        return pts[0][0]
    for (m0, a0), (m1, a1) in zip(pts, pts[1:]):
        if a1 >= goal:
            return m0 + (goal - a0) * (m1 - m0) / (a1 - a0)
    if len(pts) < 2:
        return math.inf
    (m0, a0), (m1, a1) = pts[-2], pts[-1]
    return math.inf if a1 <= a0 else m1 + (goal - a1) * (m1 - m0) / (a1 - a0)


def fit(needed: dict[int, float], grid: int = 101) -> dict:
    """The values of the first repeat and of later ones (each on a ``grid`` over [0, 1])
    whose ``steps_multiplier`` (no decay) is closest, in least squares over the factors,
    to the multipliers ``needed`` (factor -> multiplier; infinite ones are left out)."""
    pairs = [(int(e), m) for e, m in needed.items() if math.isfinite(m)]
    if not pairs:
        raise ValueError("fit needs at least one factor with a finite multiplier")
    values = np.linspace(0.0, 1.0, grid)
    err, first, later = min((sum((steps_multiplier(e, a, b) - m) ** 2 for e, m in pairs), float(a), float(b))
                            for a in values for b in values)
    return {"first_repeat_value": first, "later_repeat_value": later, "squared_error": float(err),
            "steps_multiplier": {e: steps_multiplier(e, first, later) for e in (2, 4, 6, 8)}}


def calibrate(cfg: SweepConfig, *, factors: tuple[int, ...] = (2, 4, 6, 8),
              multipliers: tuple[float, ...] = (1.0, 1.2, 1.4, 1.6), seeds: tuple[int, ...] = tuple(range(100, 108)),
              log: Callable[..., None] | None = None) -> dict:
    """Measure the repeat value (module docstring) on ``cfg``'s subset at the baseline's
    learning rate ``cfg.lr``: every seed at e = 1, then every (e, multiplier, seed),
    example echoing before augmentation with the default shuffle buffer."""
    if any(int(e) != e or e < 2 for e in factors) or not multipliers or len(seeds) < 2:
        raise ValueError("calibrate needs integral factors >= 2, multipliers and at least 2 seeds")
    log = log or (lambda **record: None)
    data = load_data(cfg)
    base = RunSpec(lr=cfg.lr, steps=cfg.steps, e_max=cfg.e_max)
    jobs = [(1, 1.0)] + [(int(e), m) for e in factors for m in multipliers]
    runs = []
    bar = progress(total=len(jobs) * len(seeds), desc="repeat-value runs", unit="run")
    for e, m in jobs:
        for seed in seeds:
            r = train_budget(replace(cfg, eval_points=(1.0,)), data,
                             replace(base, echo=float(e), steps=round(cfg.steps * m), seed=seed), final_eval=False)
            runs.append({"echo_factor": e, "multiplier": m, "seed": seed, "steps": r["steps"],
                         "fresh_examples": r["fresh_examples"], "end_accuracy": r["end_accuracy"],
                         "duplicate_rate": r["duplicate_rate"]})
            log(**runs[-1])
            bar.update(1)
    bar.close()
    baseline = [r["end_accuracy"] for r in runs if r["echo_factor"] == 1]
    goal = float(np.mean(baseline))
    per_factor = []
    for e in factors:
        points = []
        for m in multipliers:
            acc = [r["end_accuracy"] for r in runs if r["echo_factor"] == e and r["multiplier"] == m]
            points.append({"multiplier": m, "mean": float(np.mean(acc)), "std": float(np.std(acc, ddof=1)),
                           "reliable": float(np.mean(acc) - np.std(acc, ddof=1))})
        need = multiplier_needed([(p["multiplier"], p["reliable"]) for p in points], goal)
        per_factor.append({"echo_factor": int(e), "points": points, "multiplier_needed": need,
                           "repeat_value": value_for(int(e), need) if math.isfinite(need) else 0.0})
    values = [f["repeat_value"] for f in per_factor]
    model = fit({f["echo_factor"]: f["multiplier_needed"] for f in per_factor})
    return {
        "config": {"subset_seed": cfg.subset_seed, "train_images": cfg.train_images, "lr": cfg.lr,
                   "budget_steps": cfg.steps, "batch_size": cfg.batch_size, "test_images": cfg.test_images,
                   "factors": list(factors), "multipliers": list(multipliers), "seeds": list(seeds)},
        "baseline_mean": goal, "baseline_std": float(np.std(baseline, ddof=1)),
        "per_factor": per_factor, "fit": model,
        "repeat_value_one": {"mean": float(np.mean(values)),
                             "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0},
        "runs": runs,
    }
