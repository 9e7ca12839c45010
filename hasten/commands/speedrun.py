"""``hasten speedrun``: train the CIFAR-10 speedrun recipe N times and report
(see hasten.recipes.speedrun)."""

from __future__ import annotations

import argparse
import functools
import os

from hasten import cli_types as t
from hasten.errors import ConfigError
from hasten.recipes.speedrun import PRESETS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=t.existing_path, default=os.environ.get("HASTEN_DATA") or None,
                   help="dataset: image folder or archive (e.g. cifar10-jpeg.tar.xz), or the CIFAR-10 binary "
                        "files; default $HASTEN_DATA, else download canonical CIFAR-10")
    p.add_argument("--runs", type=t.positive_int, default=1, help="number of training runs")
    p.add_argument("--device", type=t.device, default="auto",
                   help="auto|cuda|cuda:N|cpu (default auto: CUDA when present)")
    p.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                   help="recipe preset (default auto: airbench94 on CUDA, cpu on CPU)")
    p.add_argument("--seed", type=t.seed, default=0, help="seed of the first run; run i uses seed+i")
    p.add_argument("--epochs", type=t.positive_float, help="override the preset's epoch count")
    p.add_argument("--batch-size", type=t.positive_int,
                   help="override the preset's batch size (lr is per 1024 examples)")
    p.add_argument("--train-subset", type=t.nonneg_int, default=0,
                   help="train on a seeded random subset of this many training images (quick CPU runs; 0 = all)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA; compiled in the warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run")
    p.add_argument("--ablate", action="store_true",
                   help="run the ablation ladder (tricks added one by one) instead of N runs of the full recipe")
    p.add_argument("--target", type=t.float_range(0, 1, lo_open=True),
                   help="accuracy target for --ablate (epochs and time to reach it); default: 0.94 on CUDA, 0.80 on CPU")
    p.add_argument("--json", type=t.output_file, help="also write the summary JSON here")


def run(args: argparse.Namespace) -> int:
    from hasten.environment import describe_environment, hardware_label, pick_device
    from hasten.recipes import speedrun
    from hasten.rundir import RunDir, write_json

    device = pick_device(args.device)
    preset, why = speedrun.choose_preset(args.preset, device)
    # Ghost batch norm splits each batch into chunks: the preset's, and with --ablate a rung's.
    ghosts = {PRESETS[preset].net.ghost_batch_size}
    if args.ablate:
        ghosts |= {changes.get("net.ghost_batch_size", 0) for _, changes in speedrun.LADDER}
    for ghost in sorted(ghosts - {0}):
        if args.batch_size is not None and args.batch_size % ghost:
            raise ConfigError(f"--batch-size {args.batch_size} must be a multiple of {ghost}, the ghost batch-norm "
                              f"size of {'an --ablate rung' if args.ablate else f'the {preset} preset'}")
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
    except BaseException:
        run_dir.close(failed=True)  # no run directory left behind empty
        raise
    run_dir.close()
    if args.json:
        write_json(args.json, summary)
    if not config.ablate:
        n = len(summary["runs"])

        def spread(std: float, digits: int) -> str:  # one run has no spread to state
            return f" +- {std:.{digits}f}" if n > 1 else ""

        print(f"\n{n} run(s) of {preset} on {summary['data']}: TTA accuracy "
              f"{summary['mean_accuracy']:.4f}{spread(summary['std_accuracy'], 4)}, time "
              f"{summary['mean_time_s']:.2f}{spread(summary['std_time_s'], 2)} s, "
              f"{summary['flops_per_run'] / 1e12:.2f} TFLOP per run, {summary['achieved_tflops']:.3f} TFLOP/s achieved")
    return 0
