"""The speedrun and the ablation ladder on the GPU, through ``hasten.recipes.speedrun.run``
(what ``hasten speedrun`` runs: the same code path and timing rules).

speedrun: per preset (``preset+compile``: the same with ``torch.compile``, the faster
variant as airbench94_compiled is airbench94's), one untimed full run first (it covers every graph the timed
runs use: all epochs, the whitening bias freezing, the TTA evaluation, and the
compiled model where the preset compiles), then n timed runs in chunks so that the
budget is checked between chunks; mean and std of TTA accuracy and time, FLOPs per
run, achieved TFLOP/s and its fraction of the device's matmul rate measured in the
same process (bf16 on CUDA, fp32 on the CPU).

ablation: the ladder of the first preset, each repeat one call (rungs in a shuffled
order, seed = repeat), to the peer's mean accuracy on this copy of the data.
"""

from __future__ import annotations

import dataclasses
import time

from gpu.plan import mean_std
from hasten.errors import ConfigError
from hasten.recipes import speedrun as recipe

TIMED = ("timed (hasten.recipes.speedrun): loader set-up (normalisation and padding on the device), whitening "
         "set-up, every training step, the final TTA evaluation; untimed: decoding, copying the uint8 data to "
         "the device, building the network, the warm-up, per-epoch validation")
WARMUP_SEED = 10_000  # the warm-up run's seed: the timed runs keep seeds 0..n-1, as `hasten speedrun --runs n`


def build(ctx, name: str) -> tuple[str, recipe.Recipe]:
    """``preset`` or ``preset+compile`` (the preset with ``torch.compile``, as
    airbench94_compiled is to airbench94): the preset's name and its recipe."""
    preset, _, extra = name.partition("+")
    if extra not in ("", "compile"):
        raise ConfigError(f"unknown speedrun variant {name!r}: a preset, or a preset followed by +compile")
    changes = {**ctx.sizes.recipe_changes, **({"compile": True} if extra else {})}
    return preset, recipe.build_recipe(preset, **changes)


def _config(ctx, name: str, **fields) -> recipe.SpeedrunConfig:
    preset, r = build(ctx, name)
    return recipe.SpeedrunConfig(recipe=r, preset=preset, device=str(ctx.device), **fields)


def preset_runs(ctx, preset: str, runs: int, budget_s: float) -> dict:
    """One untimed full run, then up to ``runs`` timed runs of ``preset`` within ``budget_s``."""
    data = ctx.dataset()
    start = time.perf_counter()
    warm = recipe.run(_config(ctx, preset, runs=1, seed=WARMUP_SEED, warmup=True), dataset=data)
    per_run = time.perf_counter() - start  # includes the internal warm-up: an over-estimate
    done: list[dict] = []
    cut_short = False
    while len(done) < runs:
        k = min(ctx.sizes.speedrun_chunk, runs - len(done))
        if done and ctx.enforce_budgets and time.perf_counter() - start + k * per_run > budget_s:
            cut_short = True
            break
        t0 = time.perf_counter()
        s = recipe.run(_config(ctx, preset, runs=k, seed=len(done), warmup=False), dataset=data)
        per_run = (time.perf_counter() - t0) / k
        done += s["runs"]
        ctx.say(f"  {preset}: {len(done)}/{runs} runs, last chunk {per_run:.2f} s per run")
    acc, acc_std = mean_std([r["tta_accuracy"] for r in done])
    t, t_std = mean_std([r["time_s"] for r in done])
    flops = warm["flops_per_run"]
    return {"preset": preset, "n_runs": len(done), "n_planned": runs, "cut_short": cut_short,
            "mean_accuracy": acc, "std_accuracy": acc_std,
            "mean_accuracy_no_tta": mean_std([r["accuracy"] for r in done])[0],
            "mean_time_s": t, "std_time_s": t_std, "flops_per_run": flops,
            "achieved_tflops": flops / t / 1e12, "runs": done, "warmup_run": warm["runs"][0],
            "recipe": dataclasses.asdict(build(ctx, preset)[1])}


def speedrun(ctx) -> dict:
    import speedrun as speedrun_benchmark  # benchmarks/speedrun.py: the same matmul-rate measurement

    presets = ctx.sizes.speedrun_presets
    rows = []
    for i, preset in enumerate(presets):
        share = ctx.time_left() / (len(presets) - i)
        rows.append(preset_runs(ctx, preset, ctx.sizes.speedrun_runs, share))
        ctx.checkpoint({"presets": rows})
    rate, dtype = speedrun_benchmark.matmul_tflops(ctx.device, seconds=ctx.sizes.matmul_seconds)
    for row in rows:
        row["fraction_of_matmul_rate"] = row["achieved_tflops"] / rate
    first = rows[0]
    return {
        "data": ctx.dataset().name, "timed": TIMED,
        "warmup": "one untimed full run of each preset (with the recipe's own 30-step warm-up) before its timed runs",
        "device_matmul_tflops": rate, "device_matmul_dtype": dtype, "presets": rows,
        "headline": {"key": f"{first['preset']}: {first['mean_accuracy']:.2%} in {first['mean_time_s']:.2f} s, "
                            f"{first['fraction_of_matmul_rate']:.0%} of {dtype} matmul" + "".join(
                                f"; {r['preset']}: {r['mean_accuracy']:.2%} in {r['mean_time_s']:.2f} s (n={r['n_runs']})"
                                for r in rows[1:]),
                     "n": first["n_runs"],
                     "spread": f"±{100 * first['std_accuracy']:.2f} pt, ±{first['std_time_s']:.2f} s"},
    }


def ablation_target(ctx) -> tuple[float, str]:
    """The peer's mean accuracy on this copy; else hasten's own speedrun mean; else the default."""
    peer = ctx.previous("peer")
    if peer is not None and peer.get("peer_mean_accuracy") is not None:
        return peer["peer_mean_accuracy"], "the peer's mean accuracy (peer section)"
    run = ctx.previous("speedrun")
    if run is not None:
        return run["presets"][0]["mean_accuracy"], (f"hasten's {run['presets'][0]['preset']} mean accuracy "
                                                    "(speedrun section; no peer result)")
    return recipe.default_target(ctx.device), "hasten.recipes.speedrun.default_target (no peer or speedrun result)"


def ablation(ctx) -> dict:
    data = ctx.dataset()
    preset = ctx.sizes.speedrun_presets[0]
    target, source = ablation_target(ctx)
    ctx.say(f"  ablation of {preset} to {target:.4f} ({source})")
    repeats, per_repeat = ctx.sizes.ablation_repeats, 0.0
    by_rung: dict[str, list[dict]] = {}
    orders, cut_short = [], False
    for rep in range(repeats):
        if rep and not ctx.can_start(per_repeat):
            cut_short = True
            break
        t0 = time.perf_counter()
        s = recipe.run(_config(ctx, preset, runs=1, seed=rep, warmup=rep == 0, ablate=True, target=target),
                       dataset=data)
        per_repeat = time.perf_counter() - t0
        orders.append(s.get("order"))
        for row in s["rungs"]:
            by_rung.setdefault(row["rung"], []).append(row)
        ctx.checkpoint({"target": target, "rungs_so_far": by_rung})
    rows = []
    for name, runs in by_rung.items():
        reached = [r for r in runs if r["epochs_to_target"] is not None]
        acc, acc_std = mean_std([r["final_accuracy"] for r in runs])
        t, t_std = mean_std([r["time_s"] for r in runs])
        rows.append({"rung": name, "n_runs": len(runs), "reached": len(reached),
                     "epochs_to_target": mean_std([r["epochs_to_target"] for r in reached])[0],
                     "time_to_target_s": mean_std([r["time_to_target_s"] for r in reached])[0],
                     "final_accuracy": acc, "final_accuracy_std": acc_std, "time_s": t, "time_s_std": t_std})
    top = rows[-1]
    reached_rungs = sum(1 for r in rows if r["reached"] == r["n_runs"])
    n = len(orders)
    key = (f"{reached_rungs}/{len(rows)} rungs reach {target:.2%}; all tricks: "
           + (f"{top['epochs_to_target']:.1f} epochs, {top['time_to_target_s']:.2f} s" if top["reached"]
              else f"not reached ({top['final_accuracy']:.2%})"))
    return {"preset": preset, "data": data.name, "target": target, "target_source": source,
            "epochs_budget": build(ctx, preset)[1].epochs,
            "n_runs": n, "n_planned": repeats, "cut_short": cut_short, "orders": orders, "rungs": rows,
            "timed": TIMED + "; epochs and seconds to the target are read at the end of each epoch",
            "headline": {"key": key, "n": n,
                         "spread": f"all tricks ±{100 * (top['final_accuracy_std'] or 0):.2f} pt, "
                                   f"±{top['time_s_std'] or 0:.2f} s"}}
