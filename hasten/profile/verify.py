"""``hasten profile --verify``: each fix's speed-up measured against the baseline, with its 95% interval.

One re-run of a fix against one re-run of the baseline is one sample of each, and on a
shared machine their difference is as much the other jobs' as the fix's (issue 43: a
batch function of 0.14 ms in a 16 ms step "verified x0.73"; three DataLoader workers on
two cores promoted to first on one run of x1.25, x0.97 timed by hand). Here a
verification is a measurement with several samples of each side, taken in turns:

- **Switched in one process** (:data:`SWITCHABLE`: bf16 autocast, hasten's bf16 gradient
  compression, both applied where each step happens): one run of the command whose measured
  window is :data:`PAIRS` pairs of blocks of :data:`BLOCK_STEPS` steps, the fix off in one
  block and on in the other, in a shuffled order within each pair
  (:func:`hasten.timing.interleaved`); a sample is a block's median step.
- **Re-runs** (every other fix: the DataLoader's workers, the loader, the batch function,
  built once per process): :data:`RERUNS` rounds, each one run of the baseline and one of
  every fix in a shuffled order (:func:`hasten.timing.interleaved`); a sample is a run's
  median step (the slowest rank's).

A fix's speed-up is baseline / fix over the pairs (a pair is a round, or two blocks side by
side), their geometric mean, with Student's t interval on the logs (:mod:`hasten.stats`, n =
the pairs, n - 1 degrees of freedom), widened to at least :data:`FLOOR` either side (runs of
one command differ by about that with no change at all: memory placement, the other jobs),
and multiplied by the fix's step-rate factor (batch echoing's data efficiency). Then:

- its interval holds 1: **no measurable difference**; it keeps the place its prediction
  gave it, neither promoted nor demoted;
- a fix that only takes work out of the step (:func:`removes_work`: batch echoing, the
  device-resident loader, the batch's rows made at once) measured slower, with an interval
  clear of 1: a **measurement anomaly** (other work on the machine), not its effect; it
  keeps its place too;
- otherwise the measured speed-up ranks it (:func:`hasten.profile.verdict.rerank`).

The verification's cost (the wall time of its runs) is stated per fix and in total.

Changes the training math: no (the runs apply fixes that may; they are separate and short).
"""

from __future__ import annotations

import math
import random
import statistics
from typing import TYPE_CHECKING

from hasten.profile.config import ProfileConfig
from hasten.profile.outcome import ProfileFailed, check_outcome, same_in_every_worker
from hasten.profile.ranking import rerank
from hasten.profile.records import Recommendation
from hasten.stats import mean_ci
from hasten.timing import interleaved

if TYPE_CHECKING:
    from hasten.profile.records import Analysis

RERUNS = 3  # runs of the baseline and of each fix that needs its own process
PAIRS = 6  # pairs of blocks, fix off and on, in one run of a fix switched between steps
BLOCK_STEPS = 5  # steps per block: its median is its sample
FLOOR = 0.02  # the interval reaches at least this far either side of the estimate (relative)
SWITCHABLE = ("autocast", "comm=bf16")  # fixes the injected process applies, or not, step by step


def removes_work(apply: str) -> bool:
    """Whether the fix only takes work out of the step (no new process, no new kind of
    arithmetic): batch echoing hands out a batch again, the resident loader gathers rows
    already in memory, the rows fix makes one batch in one gather. Such a fix measured
    slower is a measurement anomaly, not its effect."""
    return apply.startswith(("echo=", "batch_fn=echo:")) or apply in ("resident", "batch_fn=rows")


def ratio_interval(base: list[float], fixed: list[float]) -> dict:
    """baseline / fix over paired samples: the geometric mean of the pairs' ratios and its 95%
    interval (Student's t on their logs, :func:`hasten.stats.mean_ci`), at least :data:`FLOOR`
    either side; ``n`` the pairs. Fewer than two pairs give no interval (None)."""
    logs = [math.log(b / f) for b, f in zip(base, fixed) if b > 0 and f > 0]
    ci = mean_ci(logs)
    if ci["n"] < 2:
        return {"ratio": math.exp(ci["mean"]) if logs else None, "interval": None, "n": ci["n"]}
    half = max(ci["ci95"], math.log1p(FLOOR))
    return {"ratio": math.exp(ci["mean"]), "interval": (math.exp(ci["mean"] - half), math.exp(ci["mean"] + half)),
            "n": ci["n"]}


def judge(apply: str, step: dict, factor: float) -> dict:
    """A fix's verification from its step-rate ratio ``step`` (:func:`ratio_interval`) and its
    step-rate factor: the speed-up, its interval, and whether it may move the fix in the ranking
    (``decides``), with the words that say so (``finding``)."""
    lo, hi = step["interval"]
    speedup, s_lo, s_hi = step["ratio"] * factor, lo * factor, hi * factor
    if removes_work(apply) and hi < 1:
        finding, decides = ("a measurement anomaly: slower, which a fix that only takes work out of the step "
                            "cannot make it; other work on the machine ran during the runs (not counted as its "
                            "effect; ranked by its prediction)"), False
    elif s_lo <= 1 <= s_hi:
        finding, decides = "no measurable difference (ranked by its prediction)", False
    else:
        finding, decides = ("faster" if s_lo > 1 else "slower") + " (the interval is clear of 1: ranked by it)", True
    return {"speedup": speedup, "interval": (s_lo, s_hi), "n": step["n"], "decides": decides, "finding": finding}


def describe(v: dict) -> str:
    """One line for the report: the speed-up, its interval, n, how it was measured, its cost, the finding."""
    lo, hi = v["interval"]
    return (f"verified x{v['speedup']:.2f} (95% interval x{lo:.2f}-x{hi:.2f}, n = {v['n']} {v['unit']}, "
            f"{v['wall_s']:.0f} s): {v['finding']}")


def _median_step(ranks: list[dict]) -> float:
    """The slowest rank's median step (steps left out as evaluation or another loader's left out)."""
    def median(recs):
        kept = [r["span_s"] for r in recs if not r.get("excluded")] or [r["span_s"] for r in recs]
        return statistics.median(kept)
    return max(median(d["records"]["measure"]) for d in ranks)


def _blocks(ranks: list[dict]) -> tuple[list[float], list[float]]:
    """Per pair of blocks, the baseline block's and the fix's median step (each the slowest rank's)."""
    base, fixed = [], []
    for p in range(PAIRS):
        meds = {}
        for on in (False, True):
            per_rank = []
            for d in ranks:
                recs = d["records"]["measure"][2 * p * BLOCK_STEPS:(2 * p + 2) * BLOCK_STEPS]
                recs = [r for r in recs if r.get("fix_on") is on and not r.get("excluded")]
                if recs:
                    per_rank.append(statistics.median(r["span_s"] for r in recs))
            if per_rank:
                meds[on] = max(per_rank)
        if len(meds) == 2:
            base.append(meds[False])
            fixed.append(meds[True])
    return base, fixed


def _set(rec, **values) -> None:
    for k, v in values.items():
        if isinstance(rec, Recommendation):
            setattr(rec, k, v)
        else:
            rec[k] = v


class _Runs:
    """Runs of the command for the verification: each one's outcome checked, its wall time counted."""

    def __init__(self, config: ProfileConfig, analysis: Analysis, log, run_instrumented):
        self.run_instrumented, self.log, self.analysis = run_instrumented, log, analysis
        # Only the measured window, not the probes; with --seconds, the profiled run's steps.
        self.config = ProfileConfig(config.command, warmup=config.warmup, steps=max(3, analysis.steps),
                                    probe_steps=2, timeout_s=config.timeout_s, capture=config.capture,
                                    stall_s=config.stall_s, decide_s=0)
        self.switched = ProfileConfig(config.command, warmup=max(2, config.warmup), steps=2 * PAIRS * BLOCK_STEPS,
                                      probe_steps=2, timeout_s=config.timeout_s, capture=config.capture,
                                      stall_s=config.stall_s, decide_s=0)
        self.walls: list[float] = []

    def run(self, apply: str = "", switch: str = "") -> tuple[list[dict], float]:
        config = self.switched if switch else self.config
        out = self.run_instrumented(config, apply=apply, probes=False, log=self.log, switch=switch)
        self.walls.append(out.wall_s)
        ranks = check_outcome(out, config)
        cannot = next((d["apply_error"] for d in ranks if d.get("apply_error")), None)
        if cannot:  # the run went on unchanged: its steps are not the fix's
            raise ProfileFailed(f"it could not be applied: {cannot}", 2)
        return ranks, out.wall_s


def verify(config: ProfileConfig, analysis: Analysis, log, run_instrumented) -> None:
    """``run_instrumented`` is the launcher's (passed in: the launcher imports this module). Measure every fix that can be applied from outside (rejected ones too: "no gain" is a claim
    as well) against the baseline, as the module's docstring says; record each one's verification
    (``verification``: speed-up, interval, n, order, wall time, finding) and re-rank."""
    todo = [(r, r.fix, r.apply, r.step_rate_factor) for r in analysis.recommendations if r.apply] + \
           [(r, r["fix"], r["apply"], r["step_rate_factor"]) for r in analysis.rejected if r.get("apply")]
    if not todo:
        return
    runs = _Runs(config, analysis, log, run_instrumented)
    n_switched = sum(1 for _, _, apply, _ in todo if apply in SWITCHABLE)
    n_rerun = len(todo) - n_switched
    log(f"hasten profile: verifying {len(todo)} fix(es) against the baseline: "
        + ", ".join(([f"{RERUNS} rounds of {n_rerun + 1} runs (the baseline and each fix, shuffled)"] if n_rerun else [])
                    + ([f"{n_switched} run(s) switching a fix on and off"] if n_switched else [])))
    seed = random.randrange(2**31)  # recorded with each verification: its order can be rebuilt
    results: dict[int, dict] = {}
    verified = 0
    for i, (_, fix, apply, _) in enumerate(todo):
        if apply in SWITCHABLE:
            results[i] = _switched(runs, fix, apply, seed + i)
    rerun = [i for i, (_, _, apply, _) in enumerate(todo) if apply not in SWITCHABLE]
    if rerun:
        results.update(_reruns(runs, todo, rerun, seed))
    for i, (rec, fix, apply, factor) in enumerate(todo):
        res = results.get(i)
        if res is None or res.get("failed"):
            analysis.notes.append(f"verification of {fix} failed: {res['failed'] if res else 'no run'}")
            continue
        step = ratio_interval(res["base"], res["fixed"])
        if step["interval"] is None:
            analysis.notes.append(f"verification of {fix}: {step['n']} pair(s) of runs measured, too few for an "
                                  "interval (unverified)")
            continue
        v = {**judge(apply, step, factor), "unit": res["unit"], "wall_s": res["wall_s"], "order": res["order"],
             "seed": res["seed"]}
        v["text"] = describe(v)
        _set(rec, verified_speedup=v["speedup"], verified_step_s=statistics.median(res["fixed"]), verification=v)
        verified += 1
    analysis.cost.update(verify_runs_s=sum(runs.walls), verify_runs=len(runs.walls), fixes_verified=verified,
                         per_verified_fix_s=(analysis.cost["profile_run_s"] + sum(runs.walls)) / max(1, verified))
    rerank(analysis)


def _switched(runs: _Runs, fix: str, apply: str, seed: int) -> dict:
    """One run with the fix switched on and off in blocks of steps (the pattern: one character per block)."""
    pattern = "".join("1" if on else "0" for _, on in interleaved((False, True), PAIRS, seed=seed))
    runs.log(f"hasten profile: verifying {fix} in one run, switched on and off in {2 * PAIRS} blocks of "
             f"{BLOCK_STEPS} steps (order {pattern})")
    try:
        ranks, wall = runs.run(apply, switch=f"{BLOCK_STEPS}:{pattern}")
    except ProfileFailed as exc:
        return {"failed": exc.one_line()}
    base, fixed = _blocks(ranks)
    return {"base": base, "fixed": fixed, "unit": f"pairs of {BLOCK_STEPS}-step blocks in one run, interleaved",
            "wall_s": wall, "order": [("fix" if c == "1" else "baseline") for c in pattern], "seed": seed}


def _reruns(runs: _Runs, todo: list, which: list[int], seed: int) -> dict[int, dict]:
    """RERUNS rounds, each the baseline and every fix once in a shuffled order; per round, each run's
    median step. A fix whose run fails is not run again; a round whose baseline failed pairs nothing."""
    base: dict[int, float] = {}
    fixed: dict[int, dict[int, float]] = {i: {} for i in which}
    failed: dict[int, str] = {}
    walls: dict[int | None, float] = {i: 0.0 for i in [None] + which}
    order: list[str] = []
    seen_repeats: set[int] = set()
    for rnd, i in interleaved([None] + which, RERUNS, seed=seed):
        if i in failed:
            continue
        fix, apply = ("the baseline", "") if i is None else (todo[i][1], todo[i][2])
        order.append(fix)
        runs.log(f"hasten profile: verifying: round {rnd + 1} of {RERUNS}, {fix}"
                 + (f" (re-run with {apply})" if apply else ""))
        try:
            ranks, wall = runs.run(apply)
            walls[i] += wall
        except ProfileFailed as exc:
            if i is None:
                runs.analysis.notes.append(f"a baseline re-run failed: {exc.one_line()}")
            else:
                failed[i] = exc.one_line()
            continue
        if i is None:
            base[rnd] = _median_step(ranks)
            continue
        fixed[i][rnd] = _median_step(ranks)
        if i not in seen_repeats:  # each worker trains on every item: the fix, as applied, repeats the data
            seen_repeats.add(i)
            repeated = same_in_every_worker(ranks, f"in the re-run with {apply}, ", fix)
            if repeated:
                runs.analysis.notes += repeated
                _set(todo[i][0], changes_math=True)
    out = {}
    for i in which:
        if i in failed:
            out[i] = {"failed": failed[i]}
            continue
        rounds = [r for r in fixed[i] if r in base]
        out[i] = {"base": [base[r] for r in rounds], "fixed": [fixed[i][r] for r in rounds],
                  "unit": "re-runs of each, interleaved", "order": order, "seed": seed,
                  "wall_s": walls[i] + walls[None] / len(which)}  # the baseline's runs shared out
    return out
