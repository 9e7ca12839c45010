"""What a repeated example is worth: the calibration behind AutoEcho's default repeat values.

Runs ``hasten.recipes.echo.value.calibrate`` (its module docstring has the method)
on a class-balanced CIFAR-10-JPEG subset held out from the echo sweep (subset
seed 2020, seeds 100-107), with the sweep's network, budget and learning rate.
Counts only: no slow source, so the result does not depend on this machine's speed.

    python benchmarks/echo_repeat_value.py [--data PATH] [--seeds 8]

Writes benchmarks/results/echo_repeat_value.json and prints a short table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hasten.recipes.echo.config import SweepConfig
from hasten.recipes.echo.value import calibrate
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, add_data_argument, require_data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--seeds", type=int, default=8, help="seeds per setting (default 8; at least 2)")
    ap.add_argument("--subset-seed", type=int, default=2020, help="held-out subset (the sweep uses 2019)")
    ap.add_argument("--out", default=str(RESULTS / "echo_repeat_value.json"), help="results JSON (default %(default)s)")
    args = ap.parse_args()
    require_data(args.data, "echo_repeat_value")
    if args.seeds < 2:
        sys.exit("echo_repeat_value: --seeds must be at least 2 (the method uses the spread over seeds)")
    torch.set_num_threads(1)
    cfg = SweepConfig(data=args.data, subset_seed=args.subset_seed)
    with MeasuredConditions("cpu", argv=sys.argv) as cond:
        report = calibrate(cfg, seeds=tuple(range(100, 100 + args.seeds)))
    write_json(Path(args.out), {"benchmark": "echo_repeat_value", "conditions": cond.as_dict(),
                                "torch": torch.__version__, **report})
    print(f"baseline (e = 1, {report['config']['budget_steps']} steps): "
          f"{100 * report['baseline_mean']:.2f} ± {100 * report['baseline_std']:.2f}%")
    steps = " / ".join(f"{m:g}" for m in report["config"]["multipliers"])
    print(f"| e | end acc % at {steps}x steps (mean ± std) | steps needed | repeat value |")
    print("| --- | --- | --- | --- |")
    for f in report["per_factor"]:
        accs = " / ".join(f"{100 * p['mean']:.1f} ± {100 * p['std']:.1f}" for p in f["points"])
        print(f"| {f['echo_factor']} | {accs} | {f['multiplier_needed']:.2f}x | {f['repeat_value']:.2f} |")
    fit = report["fit"]
    print(f"least-squares fit: first repeat worth {fit['first_repeat_value']:.2f}, later repeats "
          f"{fit['later_repeat_value']:.2f} (squared error {fit['squared_error']:.5f}); e = 2 / 4 / 6 / 8 then take "
          + " / ".join(f"{m:.2f}x" for m in fit["steps_multiplier"].values()) + " the baseline's steps")
    print(cond.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
