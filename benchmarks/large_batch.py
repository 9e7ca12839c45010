"""Large-batch experiment: accuracy at global batch 512 .. 8192 with the same epoch
budget (SGD + linear scaling + warm-up, its learning rate tuned at every batch,
against LARS at its reference peak), and BN group sizes with a small per-replica
batch. Writes benchmarks/results/large_batch.json and .png.

SGD's baseline is tuned, not starved: at every batch size SGD runs at Goyal et
al.'s reference rate (``--sgd-lr`` per 256 images, scaled linearly) times each
factor of ``--sgd-lr-sweep``, and the best mean accuracy over the seeds is the
SGD that LARS is compared with. Every swept rate is recorded. Choosing the best
on the same seeds that report it flatters SGD slightly, never LARS.

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

    python benchmarks/large_batch.py                  # about 10 min on 2 idle cores
    python benchmarks/large_batch.py --epochs 1 --warmup-epochs 0.5 --subset 2048 --batches 512 --sgd-lr-sweep 1 --bn-groups 1 --seeds 0 --out lb-smoke.json  # smoke

Runs are interleaved: each seed is one repeat, and within it every configuration
runs once in a shuffled order (``hasten.timing.interleaved``), so that drifting load
spreads over all of them; the load average and matmul rate before and after are
recorded (``hasten.environment.MeasuredConditions``). Accuracies do not depend on
the order; wall times (``time_s``) do, and are not the point of this experiment.
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
from hasten.environment import MeasuredConditions, hardware_label
from hasten.errors import HastenError
from hasten.plots import plot_large_batch
from hasten.recipes.train import TrainConfig, train
from hasten.rundir import write_json
from hasten.timing import interleaved

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
    p.add_argument("--batches", default="512,8192", help="global batches for the SGD/LARS part")
    p.add_argument("--sgd-lr", type=float, default=0.1, help="reference rate per 256 images (linear scaling)")
    p.add_argument("--sgd-lr-sweep", default="0.25,0.5,1,2,4",
                   help="factors of the reference SGD rate tried at every batch; the best is SGD's result")
    p.add_argument("--lars-lr", type=float, default=10.0, help="peak, not scaled (TPU reference)")
    p.add_argument("--replica-batch", type=int, default=16, help="images per simulated replica")
    p.add_argument("--bn-groups", default="1,4,32", help="replicas per BN group (1 = per-replica BN)")
    p.add_argument("--bn-global-batch", type=int, default=512)
    p.add_argument("--seeds", default="0,1", help="one run per seed per configuration")
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

    configs = []  # (part, label, TrainConfig keyword arguments, extra row fields)
    factors = [float(f) for f in args.sgd_lr_sweep.split(",")]
    for batch in [int(b) for b in args.batches.split(",")]:
        for f in factors:
            configs.append(("sgd_sweep", f"batch {batch} sgd x{f:g}",
                            dict(batch_size=batch, optimizer="sgd", lr=args.sgd_lr * f, lr_scaling="linear"),
                            {"lr_factor": f}))
        configs.append(("batch", f"batch {batch} lars",
                        dict(batch_size=batch, optimizer="lars", lr=args.lars_lr, lr_scaling="none"), {}))
    same_as = {}  # a BN configuration that is already in the batch part runs once
    for k in [int(k) for k in args.bn_groups.split(",")]:
        bn_batch = k * args.replica_batch
        kw = dict(batch_size=args.bn_global_batch, optimizer="sgd", lr=args.sgd_lr, lr_scaling="linear")
        if bn_batch < args.bn_global_batch:
            kw["ghost_batch"] = bn_batch
        twin = next((label for _, label, other, _ in configs if other == kw), None)
        if twin is not None:
            same_as[f"bn group {k}"] = twin
        configs.append(("bn", f"bn group {k}", kw, {"bn_group": k, "bn_batch": bn_batch}))

    results = {
        "benchmark": "large_batch",
        "scale": "small-scale CPU experiment (not the GPU-scale experiment)",
        "dataset": f"{full.name}, {args.subset or len(ds.train)} training images, downsampled to "
                   f"{ds.image_size[0]}x{ds.image_size[1]}, full test set ({len(ds.test)} images)",
        "args": {**vars(args), "out": os.path.relpath(args.out)},  # no local install path in results
        "n_runs_per_config": len(seeds),
        "samples": [],
        "runs": [],
    }
    reports: dict[str, dict[int, dict]] = {label: {} for _, label, _, _ in configs}
    to_run = [c for c in configs if c[1] not in same_as]
    print(f"{len(to_run)} configurations x {len(seeds)} seeds, interleaved", file=sys.stderr)
    with MeasuredConditions("cpu") as cond:
        for rep, (part, label, kw, _) in interleaved(to_run, len(seeds), seed=0):
            seed = seeds[rep]
            r = train(TrainConfig(**common, **kw, seed=seed), dataset=ds)
            reports[label][seed] = r
            results["samples"].append({"config": label, "seed": seed, "accuracy": r["accuracy"],
                                       "time_s": r["time_s"]})
            print(f"  {label:<22} seed {seed}: {r['accuracy']:.4f} ({r['time_s']:.0f} s)", file=sys.stderr,
                  flush=True)
            write_json(args.out, results)  # after every run: a partial result survives

    def row(part, kw, extra, label):
        rs = [reports[same_as.get(label, label)][s] for s in seeds]
        accs = [r["accuracy"] for r in rs]
        return {"part": part, "batch": kw["batch_size"], "optimizer": kw["optimizer"],
                "bn_batch": extra.get("bn_batch", kw["batch_size"]), "bn_group": extra.get("bn_group"),
                "lr_factor": extra.get("lr_factor"), "steps": rs[0]["steps"], "peak_lr": rs[0]["peak_lr"],
                "accuracy": statistics.mean(accs), "accuracy_min": min(accs), "accuracy_max": max(accs),
                "accuracy_runs": accs, "seeds": seeds, "time_s": [r["time_s"] for r in rs]}

    rows = [row(part, kw, extra, label) for part, label, kw, extra in configs]
    for batch in sorted({r["batch"] for r in rows if r["part"] == "sgd_sweep"}):
        sweep = [r for r in rows if r["part"] == "sgd_sweep" and r["batch"] == batch]
        best = max(sweep, key=lambda r: r["accuracy"])
        rows.append({**best, "part": "batch", "tuned_from": [r["peak_lr"] for r in sweep],
                     "best_at_edge_of_sweep": best["lr_factor"] in (min(factors), max(factors))})
    results["runs"] = rows
    results["conditions"] = cond.as_dict()
    results["hardware"] = hardware_label(results["conditions"]["environment"])
    write_json(args.out, results)

    print(f"{'part':9} {'batch':>6} {'opt':5} {'BN batch':>8} {'steps':>6} {'peak lr':>8} "
          f"{'accuracy (mean, each seed)':>28}")
    for r in sorted(rows, key=lambda r: (r["part"] != "bn", r["part"], r["batch"], r["optimizer"], r["peak_lr"])):
        name = "sgd tuned" if r["part"] == "batch" and r["optimizer"] == "sgd" else r["part"]
        print(f"{name:9} {r['batch']:6d} {r['optimizer']:5} {r['bn_batch']:8d} {r['steps']:6d} "
              f"{r['peak_lr']:8.3g} {r['accuracy']:8.4f} " + " ".join(f"{a:.4f}" for a in r["accuracy_runs"]))
    print(f"{results['hardware']}, torch {torch.__version__}, n={len(seeds)} seeds")
    print(cond.summary())
    print(f"wrote {plot_large_batch(results, Path(args.out).with_suffix('.png'))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
