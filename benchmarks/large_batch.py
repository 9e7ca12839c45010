"""Large-batch experiment: accuracy at global batch 512 .. 8192 with the same epoch
budget (SGD + linear scaling + warm-up against LARS), and BN group sizes with a
small per-replica batch. Writes benchmarks/results/large_batch.json and .png.

The full experiment is a GPU-scale one (ResNet on full CIFAR-10, many epochs).
The defaults here are a small-scale CPU version: a narrow ResNet-10 on CIFAR-10-JPEG
downsampled to 16x16 (2x2 average pooling), a random training subset and a few
epochs, so that each configuration takes one to two minutes on 2 CPU cores. Accuracies
are therefore far below CIFAR-10 state of the art; what is compared is the
configurations against each other, measured side by side in one run.

Group BN part: with R replicas of b images and groups of k replicas, each BN
normalises over k*b images. On one process this is simulated exactly, for the
statistics, by ghost batch norm with virtual batches of k*b images over the global
batch (the real multi-process GroupBatchNorm computes the same statistics; its
equivalence with plain BN on the concatenated batch is tested with 2 and 4 gloo
processes in tests/test_nn_group_bn.py). Only the running-statistics average differs.

    python benchmarks/large_batch.py                  # about 15-20 min on 2 cores
    python benchmarks/large_batch.py --epochs 1 --subset 8192 --batches 512,8192  # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hasten.data import ImageDataset, Split, load_dataset
from hasten.environment import describe_environment, hardware_label
from hasten.errors import HastenError
from hasten.plots import plot_large_batch
from hasten.recipes.train import TrainConfig, train
from hasten.rundir import write_json

RESULTS = Path(__file__).parent / "results"


def downsample(split: Split, factor: int) -> Split:
    if factor == 1:
        return split
    x = F.avg_pool2d(split.images.float(), factor).round().to(torch.uint8)
    return Split(x, split.labels)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("HASTEN_DATA", "../shared/data/cifar10-jpeg.tar.xz"),
                   help="dataset (default $HASTEN_DATA, else ../shared/data/cifar10-jpeg.tar.xz)")
    p.add_argument("--downsample", type=int, default=2, help="average-pool factor (2: 32 -> 16 px)")
    p.add_argument("--subset", type=int, default=16384, help="training images (random subset; 0 = all)")
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--model", default="resnet10")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batches", default="512,2048,8192", help="global batches for the SGD/LARS part")
    p.add_argument("--sgd-lr", type=float, default=0.1, help="per 256 images (linear scaling)")
    p.add_argument("--lars-lr", type=float, default=10.0, help="peak, not scaled (TPU reference)")
    p.add_argument("--replica-batch", type=int, default=16, help="images per simulated replica")
    p.add_argument("--bn-groups", default="1,4,32", help="replicas per BN group (1 = per-replica BN)")
    p.add_argument("--bn-global-batch", type=int, default=512)
    p.add_argument("--seeds", default="0", help="one run per seed per configuration, e.g. 0,1")
    p.add_argument("--out", default=str(RESULTS / "large_batch.json"))
    args = p.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]

    torch.set_num_threads(2)
    t_load = time.perf_counter()
    try:
        full = load_dataset(args.data)
    except HastenError as exc:
        print(f"benchmarks/large_batch.py: error: {exc} (pass --data PATH or set HASTEN_DATA)", file=sys.stderr)
        return 2
    ds = ImageDataset(full.name, full.classes, downsample(full.train, args.downsample),
                      downsample(full.test, args.downsample), source=full.source)
    print(f"{full.summary()}; downsampled x{args.downsample} in {time.perf_counter() - t_load:.0f} s",
          file=sys.stderr)
    common = dict(model=args.model, width=args.width, train_subset=args.subset, epochs=args.epochs,
                  warmup_epochs=args.warmup_epochs, device="cpu")

    runs = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for opt, lr, scaling in [("sgd", args.sgd_lr, "linear"), ("lars", args.lars_lr, "none")]:
            runs.append(("batch", dict(batch_size=batch, optimizer=opt, lr=lr, lr_scaling=scaling)))
    for k in [int(k) for k in args.bn_groups.split(",")]:
        bn_batch = k * args.replica_batch
        runs.append(("bn", dict(batch_size=args.bn_global_batch, optimizer="sgd", lr=args.sgd_lr,
                                lr_scaling="linear",
                                ghost_batch=bn_batch if bn_batch < args.bn_global_batch else 0,
                                _group=k, _bn_batch=bn_batch)))

    env = describe_environment("cpu")
    results = {
        "benchmark": "large_batch",
        "scale": "small-scale CPU experiment (not the GPU-scale experiment)",
        "dataset": f"{full.name}, {args.subset or len(ds.train)} training images, downsampled to "
                   f"{ds.image_size[0]}x{ds.image_size[1]}, full test set ({len(ds.test)} images)",
        "hardware": hardware_label(env) + "; shared with other jobs during the run",
        "environment": env,
        "args": vars(args),
        "n_runs_per_config": len(seeds),
        "runs": [],
    }
    print(f"{'part':5} {'batch':>6} {'opt':5} {'BN batch':>8} {'steps':>6} {'peak lr':>8} "
          f"{'accuracy (mean, each seed)':>28}")
    for part, kw in runs:
        group, bn_batch = kw.pop("_group", None), kw.pop("_bn_batch", None)
        reports = [train(TrainConfig(**common, **kw, seed=seed), dataset=ds) for seed in seeds]
        accs = [r["accuracy"] for r in reports]
        row = {"part": part, "batch": kw["batch_size"], "optimizer": kw["optimizer"],
               "bn_batch": bn_batch or kw["batch_size"], "bn_group": group,
               "steps": reports[0]["steps"], "peak_lr": reports[0]["peak_lr"],
               "accuracy": statistics.mean(accs), "accuracy_min": min(accs), "accuracy_max": max(accs),
               "accuracy_runs": accs, "seeds": seeds, "time_s": [r["time_s"] for r in reports]}
        results["runs"].append(row)
        print(f"{part:5} {row['batch']:6d} {row['optimizer']:5} {row['bn_batch']:8d} {row['steps']:6d} "
              f"{row['peak_lr']:8.3g} {row['accuracy']:8.4f} " + " ".join(f"{a:.4f}" for a in accs),
              flush=True)
        write_json(args.out, results)  # after every configuration: a partial result survives
    print(f"wrote {plot_large_batch(results, Path(args.out).with_suffix('.png'))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
