"""Data echoing on the GPU: the device preset of ``hasten echo`` (``EchoRunConfig.for_device``)
behind simulated slow storage at R about 6, to the preset's target accuracy: no echoing,
fixed factors, and AutoEcho, each over n seeds, interleaved (``hasten.timing.interleaved``).

The storage delay comes from the step time measured first without delay
(``hasten.recipes.echo.run.measure_step_time``) as ``hasten echo --upstream-ratio R``
sets it (``hasten.recipes.echo.compare.comparison_jobs``); decoding adds to it, so
the R each e = 1 run measured, (wait + step) / step, is recorded. "The best fixed e"
is the fixed factor with the least mean wall time to the target among those that
reached it on every seed, chosen on the same seeds that report it (which flatters it
slightly, never AutoEcho).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, replace

from _common import mean, sample_std
from hasten.cores import usable_cores
from hasten.recipes.echo import (
    EchoRunConfig,
    EvalSet,
    measure_step_time,
    train_to_target,
)
from hasten.recipes.echo.compare import comparison_jobs
from hasten.timing import interleaved

KEEP = ("echo_factor", "mean_echo_factor", "upstream_ratio", "storage_ratio", "reached_target",
        "fresh_examples_to_target", "steps_to_target", "wall_time_to_target_s", "fresh_examples", "steps",
        "wall_time_s", "final_accuracy", "idle_fraction", "step_time_s", "duplicate_rate", "seed")


def echo(ctx) -> dict:
    s = ctx.sizes
    workers = min(8, max(usable_cores() - 4, 0)) if ctx.device.type == "cuda" else 0
    base = EchoRunConfig.for_device(ctx.device, data=ctx.data_path, workers=workers, **s.echo_changes)
    eval_set = EvalSet.of(base.data, base.image_size, base.device)
    step_s = measure_step_time(base, eval_set=eval_set)
    delay = comparison_jobs(base, step_s, s.echo_ratio)[0][1].upstream_delay_s
    ctx.say(f"  step {step_s * 1e3:.1f} ms at batch {base.batch_size}: storage delay {delay * 1e6:.0f} us per "
            f"example for R about {s.echo_ratio:g}")
    configs = [("e=1", 1.0), *((f"e={f:g}", f) for f in s.echo_factors), ("auto", "auto")]
    runs: dict[str, list[dict]] = {label: [] for label, _ in configs}
    order, cut_short, per_run = [], False, 0.0
    for seed, (label, factor) in interleaved(configs, s.echo_seeds, seed=0):
        if order and not ctx.can_start(per_run):
            cut_short = True
            break
        t0 = time.perf_counter()
        r = train_to_target(replace(base, echo=factor, upstream_delay_s=delay, seed=seed), eval_set=eval_set)
        per_run = max(per_run, time.perf_counter() - t0)
        runs[label].append({k: r.get(k) for k in KEEP})
        order.append([seed, label])
        ctx.say(f"  seed {seed} {label:<6} reached {r['reached_target']!s:<5} in {r['wall_time_s']:.1f} s, "
                f"{r['fresh_examples']} fresh, final {r['final_accuracy']:.4f}")
        ctx.checkpoint({"runs_so_far": runs})

    rows = {}
    for label, rs in runs.items():
        reached = [r for r in rs if r["reached_target"]]
        times = [r["wall_time_to_target_s"] for r in reached]
        rows[label] = {"n_runs": len(rs), "reached": len(reached), "wall_time_to_target_s": mean(times),
                       "wall_time_to_target_s_std": sample_std(times),
                       "fresh_examples_to_target": mean(r["fresh_examples_to_target"] for r in reached),
                       "steps_to_target": mean(r["steps_to_target"] for r in reached),
                       "final_accuracy": mean(r["final_accuracy"] for r in rs),
                       "idle_fraction": mean(r["idle_fraction"] for r in rs),
                       "mean_echo_factor": mean(r["mean_echo_factor"] for r in rs)}
    fixed = [f"e={f:g}" for f in s.echo_factors
             if rows[f"e={f:g}"]["n_runs"] and rows[f"e={f:g}"]["reached"] == rows[f"e={f:g}"]["n_runs"]]
    best = min(fixed, key=lambda k: rows[k]["wall_time_to_target_s"]) if fixed else None
    plain = rows["e=1"]["wall_time_to_target_s"]

    def speedup(label):
        t = rows[label]["wall_time_to_target_s"] if label else None
        return plain / t if plain and t else None

    measured_r = mean(r["upstream_ratio"] for r in runs["e=1"])
    n = min(rows[label]["n_runs"] for label, _ in configs)
    sb, sa = speedup(best), speedup("auto")
    key = (f"R {measured_r:.1f}: " if measured_r else "") + (
        f"best fixed {best} x{sb:.2f}" if sb else "no fixed e reached the target on every seed") + (
        f", AutoEcho x{sa:.2f}" if sa else ", AutoEcho missed") + " vs e=1 (wall time to target)"
    return {"data": os.path.basename(ctx.data_path),
            "config": asdict(replace(base, data=os.path.basename(base.data))), "step_time_s": step_s,
            "upstream_ratio_asked": s.echo_ratio, "upstream_ratio_measured": measured_r,
            "upstream_delay_s": delay, "target": base.target, "n_runs": n, "n_planned": s.echo_seeds,
            "cut_short": cut_short, "order": order, "configs": rows, "runs": runs,
            "best_fixed": best, "speedup_best_fixed": sb, "speedup_auto": sa,
            "timed": "hasten.recipes.echo.run.train_to_target: waiting for input plus training steps; evaluations, "
                     "the storage and AutoEcho's measurement paused during them",
            "headline": {"key": key, "n": n,
                         "spread": f"e=1 ±{rows['e=1']['wall_time_to_target_s_std'] or 0:.1f} s"}}
