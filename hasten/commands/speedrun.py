"""``hasten speedrun``: train the CIFAR-10 speedrun recipe N times and report
(see hasten.recipes.speedrun)."""

from __future__ import annotations

import argparse
import functools
import os

from hasten.recipes.speedrun import PRESETS


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--train-subset", type=int, default=0,
                   help="train on a seeded random subset of this many training images (quick CPU runs; 0 = all)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA; compiled in the warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run")
    p.add_argument("--ablate", action="store_true",
                   help="run the ablation ladder (tricks added one by one) instead of N runs of the full recipe")
    p.add_argument("--target", type=float,
                   help="accuracy target for --ablate (epochs and time to reach it); default: 0.94 on CUDA, 0.80 on CPU")
    p.add_argument("--json", help="also write the summary JSON here")


def run(args: argparse.Namespace) -> int:
    from hasten.environment import describe_environment, hardware_label, pick_device
    from hasten.recipes import speedrun
    from hasten.rundir import RunDir, write_json

    device = pick_device(args.device)
    preset, why = speedrun.choose_preset(args.preset, device)
    changes = {k: v for k, v in (("epochs", args.epochs), ("batch_size", args.batch_size)) if v is not None}
    if args.compile:
        changes["compile"] = True
    config = speedrun.SpeedrunConfig(
        recipe=speedrun.build_recipe(preset, **changes), preset=preset, device=str(device), data=args.data,
        runs=args.runs, seed=args.seed, train_subset=args.train_subset, warmup=not args.no_warmup,
        ablate=args.ablate, target=args.target if args.target is not None else speedrun.default_target(device))
    print(f"device: {device} ({hardware_label(describe_environment(device))}); preset: {preset} ({why})")

    run_dir = RunDir("speedrun", device=device)
    print(f"run directory: {run_dir.path}")
    try:
        summary = speedrun.run(config, run_dir=run_dir, log=functools.partial(print, flush=True))
    finally:
        run_dir.close()
    if args.json:
        write_json(args.json, summary)
    if not config.ablate:
        print(f"\n{len(summary['runs'])} run(s) of {preset} on {summary['data']}: TTA accuracy "
              f"{summary['mean_accuracy']:.4f} +- {summary['std_accuracy']:.4f}, time {summary['mean_time_s']:.2f} "
              f"+- {summary['std_time_s']:.2f} s, {summary['flops_per_run'] / 1e12:.2f} TFLOP per run, "
              f"{summary['achieved_tflops']:.3f} TFLOP/s achieved")
    return 0
