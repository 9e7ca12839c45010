"""Training throughput: float32 vs bf16 autocast (BN, loss, gradients in float32),
each in NCHW and channels_last. Writes benchmarks/results/large_batch_precision.json
and .png.

Each configuration runs ``--warmup`` untimed steps then ``--steps`` timed steps
of forward + backward + LARS step, ``--repeats`` times; within every repeat the
configurations run in a freshly shuffled order (``hasten.timing.interleaved``) so
that drifting load from other jobs spreads over all of them. The ratio to fp32
NCHW is also given within each repeat. The load average and matmul rate before
and after are recorded (``hasten.environment.MeasuredConditions``).

    python benchmarks/large_batch_precision.py                        # this machine
    python benchmarks/large_batch_precision.py --width 64 --batch 256  # GPU-sized
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

from hasten.environment import pick_device
from hasten.models.resnet import build_model
from hasten.nn.precision import autocast, batchnorm_in_float32, cross_entropy, to_channels_last
from hasten.optim import Lars, lars_param_groups
from hasten.plots import plot_bars_with_spread
from hasten.recipes.step import optimizer_step
from hasten.rundir import write_json
from hasten.timing import Stopwatch, interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean, paired_ratios, sample_std

CONFIGS = [("fp32", False, False), ("bf16", True, False),
           ("fp32 channels_last", False, True), ("bf16 channels_last", True, True)]


def images_per_s(device, model_name, width, size, batch, bf16, channels_last, warmup, steps) -> float:
    torch.manual_seed(0)
    model = batchnorm_in_float32(build_model(model_name, 1000 if size >= 64 else 10, size, width)).to(device)
    if channels_last:
        model = to_channels_last(model)
    opt = Lars(lars_param_groups(model, 1e-4), lr=1.0)
    x = torch.randn(batch, 3, size, size, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    clock = Stopwatch(device)
    for i in range(warmup + steps):
        if i == warmup:
            clock.start()
        with autocast(device, bf16):
            logits = model(x)
        optimizer_step(cross_entropy(logits, y, 0.1), opt)
    clock.stop()
    return steps * batch / clock.elapsed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="seeds the order of configurations in each repeat")
    p.add_argument("--out", default=str(RESULTS / "large_batch_precision.json"))
    args = p.parse_args(argv)

    device = pick_device(args.device)
    samples = {name: [0.0] * args.repeats for name, _, _ in CONFIGS}
    order = []
    with MeasuredConditions(device) as cond:
        for rep, (name, bf16, cl) in interleaved(CONFIGS, args.repeats, args.seed):
            order.append([rep, name])
            samples[name][rep] = images_per_s(device, args.model, args.width, args.size, args.batch,
                                              bf16, cl, args.warmup, args.steps)
    conditions = cond.as_dict()
    env = conditions["environment"]
    rows = []
    base = mean(samples["fp32"])
    print(f"{'config':20} {'images/s':>9} {'stdev':>7} {'vs fp32':>7}  {'ratio to fp32 in each repeat'}   "
          f"({hardware_label(env)}, torch {torch.__version__}, n={args.repeats})")
    for name, _, _ in CONFIGS:
        s = samples[name]
        ratios = paired_ratios(s, samples["fp32"])  # per repeat: the configurations ran in the same rounds
        row = {"config": name, "images_per_s_mean": mean(s), "images_per_s_stdev": sample_std(s),
               "speedup_vs_fp32": mean(s) / base, "samples": s,
               "ratio_to_fp32_per_repeat": ratios,
               "ratio_to_fp32_median": statistics.median(ratios)}
        rows.append(row)
        stdev = f"{row['images_per_s_stdev']:.0f}" if row["images_per_s_stdev"] is not None else "-"  # one repeat
        print(f"{name:20} {row['images_per_s_mean']:9.0f} {stdev:>7} "
              f"{row['speedup_vs_fp32']:7.2f}  " + " ".join(f"{r:.2f}" for r in ratios))
    print(cond.summary())
    write_json(args.out, {"benchmark": "large_batch_precision", "hardware": hardware_label(env),
                          "conditions": conditions, "args": {**vars(args), "out": os.path.relpath(args.out)},
                          "order": order, "rows": rows})

    plot_bars_with_spread([r["config"] for r in rows], [r["images_per_s_mean"] for r in rows],
                          [r["images_per_s_stdev"] for r in rows], Path(args.out).with_suffix(".png"),
                          ylabel="training images/s",
                          title=f"{args.model} w{args.width} {args.size}px batch {args.batch}: {hardware_label(env)}")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
