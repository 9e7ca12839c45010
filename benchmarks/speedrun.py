"""Speedrun benchmark: N timed runs of the recipe, FLOPs, achieved rate, and the
fraction of the device's measured matrix rate.

    python benchmarks/speedrun.py --data ../shared/data/cifar10-jpeg.tar.xz --runs 20
    python benchmarks/speedrun.py --data ... --ablate --runs 3     # the ablation ladder

Runs ``hasten.recipes.speedrun.run`` (what ``hasten speedrun`` runs: same code
path, same timing rules) and adds the device's dense matrix-multiply rate
measured in the same process: bf16 on CUDA, float32 on CPU. The load average and
matmul rate before and after are recorded (``hasten.environment.MeasuredConditions``).

``--ablate`` runs the recipe's ablation ladder (``hasten speedrun --ablate``,
the same code): every rung of ``hasten.recipes.speedrun.LADDER`` ``--runs``
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
import shutil
import sys
from pathlib import Path

import torch

from hasten.environment import pick_device
from hasten.errors import HastenError
from hasten.recipes import speedrun
from hasten.rundir import RunDir, write_json
from hasten.timing import Stopwatch

from _common import RESULTS, MeasuredConditions, add_data_argument, hardware_label


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
    add_data_argument(p, "dataset path")
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
        one_run = summary["std_accuracy"] is None  # no spread measured
        acc_std, time_std = ("-", "-") if one_run else (f"{summary['std_accuracy']:.4f}", f"{summary['std_time_s']:.2f}")
        print(f"{hardware_label(env)[:28]:<28} {env['torch']:<14} {summary['preset']:<10} {len(summary['runs']):>3} "
              f"{summary['mean_accuracy']:>12.4f} {acc_std:>7} {summary['mean_time_s']:>11.2f} "
              f"{time_std:>6} {summary['achieved_tflops']:>8.3f} {summary['fraction_of_matmul_rate']:>9.1%}")
    print(cond.summary())
    write_json(out, summary)
    print(f"wrote {out}")
    # The run directory (under runs/, not committed) holds the per-epoch metrics and
    # the plot; they travel with the JSON, named after it.
    rundir = Path(summary.get("rundir") or "")
    for name, suffix in (("metrics.jsonl", ".metrics.jsonl"), ("accuracy_vs_time.png", ".png"),
                         ("ablation.png", ".png")):
        if summary.get("rundir") and (rundir / name).is_file():
            shutil.copyfile(rundir / name, out.with_suffix(suffix))
            print(f"wrote {out.with_suffix(suffix)}")
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
        # The ladder too: the recipe's own (same warm-up, device settings and rows).
        return speedrun.run(config, run_dir=run_dir, log=functools.partial(print, flush=True))


if __name__ == "__main__":
    sys.exit(main())
