"""Data echoing sweep (Choi et al., 2019) on CIFAR-10-JPEG, training for real on the CPU.

Runs ``hasten echo --sweep``: (a) fresh examples to the target accuracy against
the echo factor e for each variant; (b) wall-time speedup to the target against
e at simulated upstream ratios R of about 2, 4 and 6, AutoEcho beside the fixed
factors, and AutoEcho against no echoing at R = 0.5. Every run reads JPEGs
through SlowStorage, decodes, augments, echoes, shuffles and trains a small CNN
(16x16 inputs) until the test accuracy reaches the target. Configurations are
interleaved over the repeats (seeds) so that load from other jobs on the shared
machine hits all of them alike.

Writes benchmarks/results/echo_sweep.json, echo_fresh_examples.png, echo_speedup.png.

    python benchmarks/echo_sweep.py [--data PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hasten.cli import main as hasten_main

RESULTS = Path(__file__).parent / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("HASTEN_DATA", "/work/shared/data/cifar10-jpeg.tar.xz"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    return hasten_main(["echo", "--data", args.data, "--sweep", "--repeats", str(args.repeats), "--device", "cpu",
                        "--json", str(RESULTS / "echo_sweep.json"), "--plots", str(RESULTS)])


if __name__ == "__main__":
    sys.exit(main())
