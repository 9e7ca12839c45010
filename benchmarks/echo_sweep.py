"""Data echoing sweep (Choi et al., 2019) on CIFAR-10-JPEG, training for real on the CPU.

Runs the sweep of ``hasten.recipes.echo_sweep``: (a) fresh examples to the target
accuracy against the echo factor e for each variant; (b) wall-time speedup to the
target against e at simulated upstream ratios R of about 2, 4 and 6, AutoEcho
beside the fixed factors, and AutoEcho against no echoing where the step outlasts
the pipeline (R < 1). Every run reads JPEGs through SlowStorage, decodes,
augments, echoes, shuffles and trains a small CNN (16x16 inputs, the CPU preset of
``hasten.recipes.echo``) until the test accuracy reaches the target.
Configurations are interleaved over the repeats (seeds) so that load from other
jobs on the shared machine hits all of them alike.

Writes benchmarks/results/echo_sweep.json, echo_fresh_examples.png, echo_speedup.png.

    python benchmarks/echo_sweep.py [--data PATH] [--repeats 3]

Defaults: ``--data`` is ``$HASTEN_DATA`` if set, else ``../shared/data/cifar10-jpeg.tar.xz``
relative to the current directory; ``--repeats 3`` seeds per configuration; CPU,
one torch thread (on a shared CPU a second thread made steps 5x slower).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from hasten.environment import describe_environment, hardware_label
from hasten.recipes.echo import EchoRunConfig
from hasten.recipes.echo_sweep import EchoSweepConfig, format_table, run, write_plots
from hasten.rundir import write_json

RESULTS = Path(__file__).parent / "results"
DEFAULT_DATA = os.path.join("..", "shared", "data", "cifar10-jpeg.tar.xz")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("HASTEN_DATA") or DEFAULT_DATA,
                    help=f"CIFAR-10-JPEG archive or folder (default $HASTEN_DATA, else {DEFAULT_DATA})")
    ap.add_argument("--repeats", type=int, default=3, help="runs (seeds) per configuration (default 3)")
    args = ap.parse_args()
    if not os.path.exists(args.data):
        sys.exit(f"echo_sweep: no data at {args.data}; pass --data PATH or set HASTEN_DATA")
    torch.set_num_threads(1)
    report = run(EchoSweepConfig(EchoRunConfig.for_device("cpu", data=args.data), sweep=True, repeats=args.repeats))
    env = describe_environment("cpu")
    results = {"benchmark": "echo_sweep", "environment": env, "hardware": hardware_label(env),
               "note": "2 CPU cores shared with other jobs; compare ratios measured in one run", **report}
    write_json(RESULTS / "echo_sweep.json", results)
    print(format_table(report["summary"]))
    for path in write_plots(report["summary"], RESULTS):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
