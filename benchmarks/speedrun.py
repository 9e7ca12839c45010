"""Speedrun benchmark: N timed runs of the recipe, FLOPs, achieved rate, and the
fraction of the device's measured matrix rate.

    python benchmarks/speedrun.py --data ../shared/data/cifar10-jpeg.tar.xz --runs 20
    python benchmarks/speedrun.py --data ... --ablate --runs 1     # the ablation ladder

Runs ``hasten speedrun`` (same code path, same timing rules) and adds the
device's dense matrix-multiply rate measured in the same process: bf16 on CUDA,
float32 on CPU. Writes benchmarks/results/speedrun-<device>-<preset>.json (or
speedrun-ablation-<device>-<preset>.json) and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from hasten.cli import main as hasten_main
from hasten.environment import describe_environment, hardware_label, pick_device
from hasten.rundir import write_json

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_tflops(device: torch.device, seconds: float = 3.0) -> tuple[float, str]:
    """Best sustained dense matmul rate: bf16 8192^3 on CUDA, fp32 2048^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 5 * 2 * n ** 3 / (time.perf_counter() - t0) / 1e12)
    return best, str(dtype).replace("torch.", "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="dataset path (default $HASTEN_DATA / canonical download)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--preset", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--ablate", action="store_true", help="run the ablation ladder instead")
    p.add_argument("--target", type=float, help="ablation target accuracy")
    p.add_argument("--epochs", type=float, help="override the preset's epochs")
    p.add_argument("--train-subset", type=int, help="seeded random subset of the training images")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", type=Path, help="JSON path (default under benchmarks/results/)")
    args = p.parse_args(argv)

    device = pick_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        summary_path = Path(tmp) / "summary.json"
        cli = ["speedrun", "--runs", str(args.runs), "--preset", args.preset, "--device", str(device),
               "--json", str(summary_path)]
        for flag, value in (("--data", args.data), ("--target", args.target), ("--epochs", args.epochs),
                            ("--train-subset", args.train_subset)):
            if value is not None:
                cli += [flag, str(value)]
        if args.ablate:
            cli.append("--ablate")
        if args.compile:
            cli.append("--compile")
        rc = hasten_main(cli)
        if rc:
            return rc
        summary = json.loads(summary_path.read_text())
    env = describe_environment(device)
    summary["environment"] = env
    summary["command"] = "python benchmarks/speedrun.py " + " ".join(argv if argv is not None else sys.argv[1:])
    summary["note"] = ("machine shared with other jobs while this ran" if device.type == "cpu" else None)
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
    write_json(out, summary)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
