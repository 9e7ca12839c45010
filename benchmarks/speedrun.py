"""Speedrun benchmark: N timed runs of the recipe, FLOPs, achieved rate, and the
fraction of the device's measured matrix rate.

    python benchmarks/speedrun.py --data ../shared/data/cifar10-jpeg.tar.xz --runs 20
    python benchmarks/speedrun.py --data ... --ablate --runs 3     # the ablation ladder

Runs ``hasten.recipes.speedrun.run`` (what ``hasten speedrun`` runs: same code
path, same timing rules) and adds the device's dense matrix-multiply rate
measured in the same process: bf16 on CUDA, float32 on CPU. The load average and
matmul rate before and after are recorded (``hasten.environment.MeasuredConditions``).

``--ablate`` trains every rung of ``hasten.recipes.speedrun.LADDER`` ``--runs``
times, the rungs in a freshly shuffled order in every repeat
(``hasten.timing.interleaved``; repeat i uses seed i), so that load drifting
during the ladder spreads over all rungs instead of making later rungs look
faster or slower. Writes benchmarks/results/speedrun-<device>-<preset>.json (or
speedrun-ablation-<device>-<preset>.json), keeps the run directory, and prints a
short table.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

import torch

from hasten.data.normalize import channel_stats
from hasten.environment import MeasuredConditions, describe_environment, hardware_label, pick_device
from hasten.errors import HastenError
from hasten.recipes import speedrun
from hasten.recipes.common import load_training_data
from hasten.rundir import RunDir, write_json
from hasten.timing import Stopwatch, interleaved

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_tflops(device: torch.device, seconds: float = 3.0) -> tuple[float, str]:
    """Best sustained dense matmul rate: bf16 8192^3 on CUDA, fp32 2048^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, spent = 0.0, 0.0
    while spent < seconds:
        with Stopwatch(device) as clock:
            for _ in range(5):
                a @ b
        spent += clock.elapsed
        best = max(best, 5 * 2 * n ** 3 / clock.elapsed / 1e12)
    return best, str(dtype).replace("torch.", "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("HASTEN_DATA", "../shared/data/cifar10-jpeg.tar.xz"),
                   help="dataset path (default $HASTEN_DATA, else ../shared/data/cifar10-jpeg.tar.xz)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--preset", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--ablate", action="store_true", help="run the ablation ladder instead")
    p.add_argument("--target", type=float, help="ablation target accuracy")
    p.add_argument("--epochs", type=float, help="override the preset's epochs")
    p.add_argument("--train-subset", type=int, default=0, help="seeded random subset of the training images")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", type=Path, help="JSON path (default under benchmarks/results/)")
    args = p.parse_args(argv)

    try:
        with MeasuredConditions(pick_device(args.device)) as cond:
            summary = _run(args)
    except HastenError as exc:
        print(f"benchmarks/speedrun.py: error: {exc}", file=sys.stderr)
        return 2
    device = torch.device(summary["device"])
    env = summary["environment"]
    summary["command"] = "python benchmarks/speedrun.py " + " ".join(argv if argv is not None else sys.argv[1:])
    summary["conditions"] = cond.as_dict()
    kind = "speedrun-ablation" if args.ablate else "speedrun"
    out = args.out or RESULTS / f"{kind}-{device.type}-{summary['preset']}.json"

    if not args.ablate:
        rate, dtype = matmul_tflops(device)
        summary["device_matmul_tflops"] = rate
        summary["device_matmul_dtype"] = dtype
        summary["fraction_of_matmul_rate"] = summary["achieved_tflops"] / rate
        print(f"\n{'hardware':<28} {'torch':<14} {'preset':<10} {'n':>3} {'TTA acc mean':>12} {'std':>7} "
              f"{'time_s mean':>11} {'std':>6} {'TFLOP/s':>8} {'of matmul':>9}")
        print(f"{hardware_label(env)[:28]:<28} {env['torch']:<14} {summary['preset']:<10} {len(summary['runs']):>3} "
              f"{summary['mean_accuracy']:>12.4f} {summary['std_accuracy']:>7.4f} {summary['mean_time_s']:>11.2f} "
              f"{summary['std_time_s']:>6.2f} {summary['achieved_tflops']:>8.3f} {summary['fraction_of_matmul_rate']:>9.1%}")
    print(cond.summary())
    write_json(out, summary)
    print(f"wrote {out}")
    return 0


def _run(args) -> dict:
    device = pick_device(args.device)
    preset, _ = speedrun.choose_preset(args.preset, device)
    changes = {"epochs": args.epochs} if args.epochs is not None else {}
    if args.compile:
        changes["compile"] = True
    config = speedrun.SpeedrunConfig(
        recipe=speedrun.build_recipe(preset, **changes), preset=preset, device=str(device), data=args.data,
        runs=args.runs, train_subset=args.train_subset, ablate=args.ablate,
        target=args.target if args.target is not None else speedrun.default_target(device))
    if not Path(args.data).exists():
        raise HastenError(f"no dataset at {args.data}: pass --data PATH or set HASTEN_DATA")
    with RunDir("speedrun", device=device) as run_dir:
        print(f"run directory: {run_dir.path}")
        if args.ablate:
            return _ladder(config, run_dir, functools.partial(print, flush=True))
        return speedrun.run(config, run_dir=run_dir, log=functools.partial(print, flush=True))


def _ladder(config: speedrun.SpeedrunConfig, run_dir: RunDir, say) -> dict:
    """Every rung ``config.runs`` times, interleaved: one run of each rung per repeat,
    in a shuffled order (repeat i uses seed ``config.seed + i`` for every rung)."""
    device = torch.device(config.device)
    rungs = speedrun.ladder_recipes(config.recipe)  # invalid rungs fail before any work
    data = load_training_data(config.data, batch_size=config.recipe.batch_size,
                              train_subset=config.train_subset)
    say(f"data: {data.summary()}")
    mean_std = channel_stats(data.train.images)
    if config.warmup:  # untimed: first-call overheads, as in speedrun.run
        speedrun.train_run(config.recipe, data, device, mean_std=mean_std, seed=config.seed, max_steps=3)
    say(f"ablation ladder: {len(rungs)} rungs x {config.runs} run(s), interleaved; target {config.target:.2%}")
    results: dict[str, list] = {name: [] for name, _ in rungs}
    order = []
    for rep, (name, recipe) in interleaved(rungs, config.runs, seed=config.seed):
        r = speedrun.train_run(recipe, data, device, mean_std=mean_std, seed=config.seed + rep,
                               target=config.target)
        results[name].append(r)
        order.append([rep, name])
        run_dir.log(rung=name, repeat=rep, tta_accuracy=r.tta_accuracy, time_s=r.time_s,
                    epochs_to_target=r.epochs_to_target, time_to_target_s=r.time_to_target_s)
        say(f"  repeat {rep} {name:<34} {r.tta_accuracy:.4f} {r.time_s:7.1f} s")

    def mean_std_of(xs):
        return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (None, None)

    rows = []
    say(f"{'rung':<34} {'reached':>7} {'epochs_to_target':>16} {'final_acc mean':>14} {'std':>6} {'time_s':>7}")
    for name, _ in rungs:
        runs = results[name]
        reached = [r for r in runs if r.epochs_to_target is not None]
        acc, acc_std = mean_std_of([r.tta_accuracy for r in runs])
        t, t_std = mean_std_of([r.time_s for r in runs])
        rows.append({"rung": name, "runs": len(runs), "reached": len(reached),
                     "epochs_to_target": statistics.fmean(r.epochs_to_target for r in reached) if reached else None,
                     "time_to_target_s": statistics.fmean(r.time_to_target_s for r in reached) if reached else None,
                     "final_accuracy": acc, "final_accuracy_std": acc_std,
                     "final_accuracy_runs": [r.tta_accuracy for r in runs],
                     "time_s": t, "time_s_std": t_std, "time_s_runs": [r.time_s for r in runs],
                     "cpu_time_s": statistics.fmean(r.cpu_time_s for r in runs)})
        ep = f"{rows[-1]['epochs_to_target']:.1f}" if reached else "-"
        say(f"{name:<34} {len(reached):>3}/{len(runs):<3} {ep:>16} {acc:>14.4f} {acc_std:>6.4f} {t:>7.1f}")
    summary = {"preset": config.preset, "target": config.target, "epochs_budget": config.recipe.epochs,
               "device": str(device), "data": data.name, "train_subset": config.train_subset,
               "runs_per_rung": config.runs, "order": order, "rungs": rows,
               "environment": describe_environment(device), "rundir": str(run_dir.path)}
    run_dir.write_results(summary)
    return summary


if __name__ == "__main__":
    sys.exit(main())
