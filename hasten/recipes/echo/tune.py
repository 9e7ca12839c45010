"""Tuning as Choi et al. (arXiv:1907.05550) did per setting: the learning rate on a grid,
and a longer budget when no grid value reaches the target (``tune``), ranked by fresh
examples to the target (``_rank``).

Used by ``hasten.recipes.echo.sweep`` and ``hasten.recipes.echo.target``. Changes the
training math: no (it chooses among runs).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from hasten.recipes.echo.budget import train_budget
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import MemoryData


def _rank(result: dict) -> tuple:
    """Tuning order: reached the target, then fewest fresh examples, fewest steps, best end accuracy."""
    return (not result["reached_target"], result["fresh_examples_to_target"] or math.inf,
            result["steps_to_target"] or math.inf, -(result["end_accuracy"] or 0.0))


def tune(cfg: SweepConfig, data: MemoryData, spec: RunSpec, target: float, log,
         budget: Callable[..., dict] | None = None) -> tuple[RunSpec, list[dict]]:
    """The learning rate (and if needed a longer budget) for ``spec`` on seed 0: the grid
    value that reaches ``target`` with the fewest fresh examples. ``budget(phase, spec,
    **kw)`` runs one training run (default: ``train_budget``; the sweep's goes through
    its journal)."""
    if budget is None:
        def budget(phase: str, spec: RunSpec, **kw) -> dict:
            return train_budget(cfg, data, spec, **kw)
    trials = [budget("tune", replace(spec, lr=cfg.lr * m, seed=0), target=target) for m in cfg.lr_grid]
    for t in trials:
        log(event="tune", **_brief(t))
    best = min(trials, key=_rank)
    if not best["reached_target"] and cfg.extra_budget > 1:
        longer = budget("tune", replace(spec, lr=best["lr"], seed=0, steps=round(spec.steps * cfg.extra_budget)),
                        target=target)
        log(event="tune", **_brief(longer))
        trials.append(longer)
        best = min(trials, key=_rank)
    return replace(spec, lr=best["lr"], steps=best["budget_steps"]), trials


def _brief(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "curve"}
