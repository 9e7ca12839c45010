"""``hasten speedrun``: train the CIFAR-10 speedrun recipe N times and report."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from hasten.environment import describe_environment, hardware_label, pick_device
from hasten.errors import ConfigError
from hasten.rundir import RunDir, write_json

TABLE_HEADER = f"{'run':>3} {'epoch':>5} {'train_loss':>10} {'train_acc':>9} {'val_acc':>8} {'tta_acc':>8} {'time_s':>8}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hasten.recipes.speedrun import PRESETS

    p.add_argument("--data", default=os.environ.get("HASTEN_DATA"),
                   help="dataset: image folder or archive (e.g. cifar10-jpeg.tar.xz), or the CIFAR-10 binary "
                        "files; default $HASTEN_DATA, else download canonical CIFAR-10")
    p.add_argument("--runs", type=int, default=1, help="number of training runs (default 1)")
    p.add_argument("--device", default="auto", help="auto|cuda|cpu (default auto: CUDA when present)")
    p.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                   help="recipe preset (default auto: airbench94 on CUDA, cpu on CPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first run; run i uses seed+i")
    p.add_argument("--epochs", type=float, help="override the preset's epoch count")
    p.add_argument("--batch-size", type=int, help="override the preset's batch size (lr is per 1024 examples)")
    p.add_argument("--train-subset", type=int,
                   help="train on a seeded random subset of this many training images (quick CPU runs)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA; compiled in the warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run")
    p.add_argument("--ablate", action="store_true",
                   help="run the ablation ladder (tricks added one by one) instead of N runs of the full recipe")
    p.add_argument("--target", type=float,
                   help="accuracy target for --ablate (epochs and time to reach it); default: 0.94 on CUDA, 0.80 on CPU")
    p.add_argument("--json", help="also write the summary JSON here")


def choose_preset(requested: str, device: torch.device) -> tuple[str, str]:
    if requested != "auto":
        return requested, "asked for with --preset"
    if device.type == "cuda":
        return "airbench94", "CUDA device present: the full recipe"
    return "cpu", ("no CUDA device: the 'cpu' preset (narrower net, fewer epochs) finishes in minutes on "
                   "2 cores, where the full 'airbench94' recipe would take hours")


def run(args: argparse.Namespace) -> int:
    from hasten.data import load_dataset
    from hasten.data.device_loader import channel_stats
    from hasten.recipes.speedrun import PRESETS, flops_per_run, train_run

    if args.runs < 1:
        raise ConfigError(f"--runs must be >= 1, got {args.runs}")
    if args.target is not None and not 0 < args.target <= 1:
        raise ConfigError(f"--target is an accuracy in (0, 1], got {args.target}")
    device = pick_device(args.device)
    preset, why = choose_preset(args.preset, device)
    overrides = {k: v for k, v in (("epochs", args.epochs), ("batch_size", args.batch_size)) if v is not None}
    if args.compile:
        overrides["compile"] = True
    try:
        recipe = PRESETS[preset].replace(**overrides)
    except ValueError as exc:  # Recipe validates its own fields
        raise ConfigError(str(exc)) from None
    print(f"device: {device} ({hardware_label(describe_environment(device))}); preset: {preset} ({why})")

    t0 = time.perf_counter()
    data = load_dataset(args.data)
    print(f"data: {data.name} from {data.source}: {len(data.train)} train / {len(data.test)} test images, "
          f"{'cached' if data.cached else 'decoded'} in {time.perf_counter() - t0:.1f} s"
          + (f", {len(data.skipped)} files skipped" if data.skipped else ""))
    if args.train_subset is not None:
        data = train_subset(data, args.train_subset)
    if len(data.train) < recipe.batch_size:
        raise ConfigError(f"{data.name} has {len(data.train)} training images, fewer than one batch of "
                          f"{recipe.batch_size}: pass a smaller --batch-size")
    mean_std = channel_stats(data.train.images)

    rundir = RunDir("speedrun", device=device)
    config = {"preset": preset, "recipe": dataclasses.asdict(recipe), "runs": args.runs, "seed": args.seed,
              "data": data.name, "data_source": str(data.source), "device": str(device)}
    rundir.write_config(config)
    print(f"run directory: {rundir.path}")

    if not args.no_warmup:
        # Untimed: first-call overheads (allocator, cuDNN autotune, compilation).
        steps = 30 if recipe.compile or device.type == "cuda" else 3
        train_run(recipe, data, device, seed=args.seed, max_steps=steps, mean_std=mean_std)

    if args.ablate:
        return _ablate(args, preset, recipe, data, device, mean_std, rundir)

    print("timed: loader set-up, whitening set-up, training, final TTA evaluation; "
          "untimed: data loading, warm-up, per-epoch validation")
    print(TABLE_HEADER)
    results = []
    for i in range(args.runs):
        def on_epoch(rec, i=i):
            rundir.log(run=i, **rec)
            tta = f"{rec['tta_accuracy']:8.4f}" if rec["tta_accuracy"] is not None else f"{'':>8}"
            print(f"{i:>3} {rec['epoch']:>5} {rec['train_loss']:>10.4f} {rec['train_accuracy']:>9.4f} "
                  f"{rec['val_accuracy']:>8.4f} {tta} {rec['time_s']:>8.2f}", flush=True)

        res = train_run(recipe, data, device, seed=args.seed + i, on_epoch=on_epoch, mean_std=mean_std)
        results.append(res)

    flops = flops_per_run(recipe, data, device)
    summary = summarize(results, preset=preset, device=device, flops=flops, data=data.name,
                        environment=rundir.environment, rundir=str(rundir.path))
    print(f"\n{len(results)} run(s) of {preset} on {data.name}: TTA accuracy {summary['mean_accuracy']:.4f} "
          f"+- {summary['std_accuracy']:.4f}, time {summary['mean_time_s']:.2f} +- {summary['std_time_s']:.2f} s, "
          f"{flops / 1e12:.2f} TFLOP per run, {summary['achieved_tflops']:.3f} TFLOP/s achieved")
    rundir.write_results(summary)
    _plot_runs(results, rundir.path / "accuracy_vs_time.png", f"{preset} on {data.name} ({device.type})")
    if args.json:
        write_json(args.json, summary)
    rundir.close()
    return 0


def train_subset(data, n: int):
    """The same data set with a seeded random subset of ``n`` training images
    (image folders are stored class by class, so a prefix would miss classes)."""
    from hasten.data import ImageDataset, Split

    if not 0 < n <= len(data.train):
        raise ConfigError(f"--train-subset must be in 1..{len(data.train)}, got {n}")
    idx = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(0))[:n].sort().values
    return ImageDataset(data.name, data.classes, Split(data.train.images[idx], data.train.labels[idx]), data.test,
                        data.source, data.skipped, data.cached)


def summarize(results, *, preset, device, flops, **extra) -> dict:
    tta = [r.tta_accuracy for r in results]
    times = [r.time_s for r in results]
    return {
        "runs": [{"accuracy": r.accuracy, "tta_accuracy": r.tta_accuracy, "time_s": r.time_s,
                  "cpu_time_s": r.cpu_time_s} for r in results],
        "mean_accuracy": statistics.fmean(tta),  # headline: with the recipe's TTA, as airbench reports
        "std_accuracy": statistics.stdev(tta) if len(tta) > 1 else 0.0,
        "mean_accuracy_no_tta": statistics.fmean(r.accuracy for r in results),
        "mean_time_s": statistics.fmean(times),
        "std_time_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "mean_cpu_time_s": statistics.fmean(r.cpu_time_s for r in results),
        "device": str(device),
        "preset": preset,
        "flops_per_run": flops,
        "achieved_tflops": flops / statistics.fmean(times) / 1e12,
        **extra,
    }


def _ablate(args, preset, top, data, device, mean_std, rundir) -> int:
    from hasten.plots import plot_bars
    from hasten.recipes.speedrun import ladder_recipes, train_run

    target = args.target if args.target is not None else (0.94 if device.type == "cuda" else 0.80)
    print(f"ablation ladder: tricks added one by one, {args.runs} run(s) each, target {target:.2%} "
          f"(epochs and timed seconds at the first epoch whose accuracy reaches it)")
    print(f"{'rung':<34} {'epochs_to_target':>16} {'time_to_target_s':>16} {'final_acc':>9} {'time_s':>8}")
    rows = []
    for name, recipe in ladder_recipes(top):
        runs = [train_run(recipe, data, device, seed=args.seed + i, target=target, mean_std=mean_std)
                for i in range(args.runs)]
        reached = [r for r in runs if r.epochs_to_target is not None]
        row = {"rung": name, "runs": len(runs), "reached": len(reached),
               "epochs_to_target": statistics.fmean(r.epochs_to_target for r in reached) if reached else None,
               "time_to_target_s": statistics.fmean(r.time_to_target_s for r in reached) if reached else None,
               "final_accuracy": statistics.fmean(r.tta_accuracy for r in runs),
               "time_s": statistics.fmean(r.time_s for r in runs)}
        rows.append(row)
        rundir.log(**row)
        ep = f"{row['epochs_to_target']:.1f}" if reached else "not reached"
        tt = f"{row['time_to_target_s']:.1f}" if reached else "-"
        print(f"{name:<34} {ep:>16} {tt:>16} {row['final_accuracy']:>9.4f} {row['time_s']:>8.1f}", flush=True)
    summary = {"preset": preset, "target": target, "epochs_budget": top.epochs, "device": str(device), "data": data.name,
               "rungs": rows, "environment": rundir.environment}
    rundir.write_results(summary)
    plot_bars([r["rung"] for r in rows], [r["final_accuracy"] for r in rows], rundir.path / "ablation.png",
              xlabel="final accuracy (with the rung's TTA)", title=f"Ablation ladder on {data.name} ({device.type})")
    if args.json:
        write_json(args.json, summary)
    rundir.close()
    return 0


def _plot_runs(results, path, title) -> None:
    from hasten.plots import plot_curves

    curves = [(f"run {i}", [e["time_s"] for e in r.epochs], [e["val_accuracy"] for e in r.epochs])
              for i, r in enumerate(results)]
    plot_curves(curves, path, xlabel="timed seconds", ylabel="validation accuracy (no TTA)", title=title)
