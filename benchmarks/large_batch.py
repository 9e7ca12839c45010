"""Large-batch experiment: steps to a target and accuracy at equal epochs against the
global batch, tuned momentum SGD (Nesterov) against tuned LARS, the gradient noise
scale, and batch norm over groups of replicas. Writes benchmarks/results/large_batch.json (the
summary), large_batch.runs.jsonl.gz (every run) and large_batch.png.

Set-up (a CPU-sized version of Shallue et al. 2018 / Goyal et al. 2017):

- data: the full CIFAR-10-JPEG (50,000 training, 10,000 test images), decoded once
  (hasten's cache) and average-pooled to ``--resolution`` px (8: 4x4 pooling),
  normalised, held in memory as one tensor; random horizontal flips; no DataLoader.
- network (``SmallNet``): 3x3 conv 3->16 + BN + ReLU + 2x2 max-pool, then a fully
  connected 256->128 + BN + ReLU, then 128->10 (about 35k parameters). Both BNs are
  BatchNorm2d (the hidden layer as 1x1 maps), so ghost BN simulates group BN on both.
- for every batch in ``--batches`` and each optimizer (SGD with Nesterov momentum
  0.9; LARS, eta 0.001, momentum 0.9), a learning-rate grid of ``--grid-points``
  peak rates spaced by 2x, from half a per-batch centre up (SGD: ``--sgd-lr`` x
  (B/256)^0.5, square-root scaling, so the grid reaches 4x that, near linear scaling;
  LARS: ``--lars-lr`` x (B/256)^0.25); when the best mean accuracy sits at an edge of its grid, the grid is
  extended by one more 2x point on that side and those runs are added (up to
  ``--max-extend`` times);
- every run: ``--epochs`` epochs, linear warm-up over ``--warmup-epochs`` then
  polynomial (power 2) decay to 0 (hasten.optim.WarmupPolyDecay, as ``hasten train``),
  label smoothing 0.1, weight decay 5e-4 (not on BN parameters or biases), seeds
  ``--seeds`` (initialisation, order and flips). Test accuracy is evaluated every
  epoch (every second epoch in the first half), so every run has a curve.
- the gradient noise scale (hasten.optim.noise_scale.NoiseScale) is probed in every run about
  every ``--probe-images`` training images: ``--probe-micro`` micro-batches of
  ``--probe-batch`` random training images, their mean squared gradient norm and the
  squared norm of their mean (B_small and B_big of McCandlish et al.), BN running
  statistics frozen during the probe, so training is unchanged.
- target: the accuracy the tuned batch-256 configuration reaches at the end of its
  runs (the lower of its seeds, so both reach it). Steps to target of a configuration:
  the first evaluated step at which its test accuracy reaches the target, the mean
  over seeds (not reached if any seed misses). Each batch's point is its best
  learning rate. Batches that miss the target within ``--epochs`` get a second budget
  (``--long-epochs``) at their best rate, as Shallue et al. tune the budget too.
- group BN: at batch ``--bn-global-batch``, replicas of ``--replica-batch`` images,
  groups of k replicas, simulated exactly (for the statistics) by ghost BN over k x b
  images on one process; SGD at that batch's tuned rate.

Runs are interleaved in a shuffled order (``hasten.timing.interleaved``), the results are
rewritten after every run (``_common.write_results``: the summary, and every run in
``large_batch.runs.jsonl.gz``), and a rerun skips every run already there (resumable; the
analysis is redone from the runs). One thread; the set-up is sized for one core.

This file is the driver (the grid, its extensions, the second budget, group BN, resuming); its
parts beside it: ``_large_batch_train.py`` (the network and one run), ``_large_batch_analysis.py``
(the analysis from the runs) and ``_large_batch_report.py`` (the tables and the figure).

    python benchmarks/large_batch.py                                       # about 75 min on one core
    python benchmarks/large_batch.py --epochs 2 --batches 256,1024 --grid-points 2 --max-extend 0 \\
        --seeds 0 --bn-groups 1 --long-epochs 0 --out /tmp/lb-smoke.json    # smoke, 1 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from hasten.data import load_dataset
from hasten.errors import HastenError
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, hardware_label, load_results, write_results
from _large_batch_analysis import analyse
from _large_batch_report import plot, print_tables
from _large_batch_train import SmallNet, prepare, train_run

# Settings, written unrounded: a resumed grid finds its learning rates by value, and
# --report analyses again with the arguments the runs were made with.
EXACT = frozenset({"peak_lr", "epochs", "args"})


def key_of(cfg: dict) -> str:
    ghost = f" ghost {cfg['ghost']}" if cfg.get("ghost") else ""
    return (f"{cfg['part']} b{cfg['batch']} {cfg['optimizer']} lr {cfg['peak_lr']:.6g} ep {cfg['epochs']:g}"
            f"{ghost} seed {cfg['seed']}")


def grid(center: float, points: int) -> list[float]:
    lo = -((points - 1) // 2)
    return [round(center * 2.0 ** (lo + i), 6) for i in range(points)]


def report_only(args) -> int:
    """--report: the analysis and plot again from the JSON's runs, nothing trained."""
    out = Path(args.out)
    results = load_results(out)
    if results is None:
        raise SystemExit(f"benchmarks/large_batch.py: --report: no results at {out}")
    saved = argparse.Namespace(**{**results["args"], "lower_targets_list": args.lower_targets_list})
    saved.lower_targets = args.lower_targets
    results["args"]["lower_targets"] = args.lower_targets
    seeds = [int(x) for x in saved.seeds.split(",")]
    results["analysis"] = analyse(results["runs"], saved, seeds)
    write_results(out, results, EXACT)
    print_tables(results)
    print(f"wrote {out} and {plot(results, out.with_suffix('.png'))}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(p, "dataset")
    p.add_argument("--resolution", type=int, default=8, help="pixels per side after average pooling (32/k)")
    p.add_argument("--width", type=int, default=16, help="conv channels")
    p.add_argument("--hidden", type=int, default=128, help="hidden units")
    p.add_argument("--epochs", type=float, default=30.0)
    p.add_argument("--warmup-epochs", type=float, default=3.0)
    p.add_argument("--batches", default="256,1024,4096,8192")
    p.add_argument("--sgd-lr", type=float, default=0.2, help="SGD grid centre at batch 256 (x (B/256)^0.5)")
    p.add_argument("--lars-lr", type=float, default=5.0, help="LARS grid centre at batch 256 (x (B/256)^0.25)")
    p.add_argument("--grid-points", type=int, default=4, help="learning rates per (batch, optimizer), 2x apart")
    p.add_argument("--max-extend", type=int, default=2, help="grid extensions when the best is at an edge")
    p.add_argument("--long-epochs", type=float, default=60.0,
                   help="second budget for batches that miss the target (0: none)")
    p.add_argument("--probe-images", type=int, default=10000, help="training images between noise-scale probes")
    p.add_argument("--probe-batch", type=int, default=128, help="B_small of the probe")
    p.add_argument("--probe-micro", type=int, default=8, help="micro-batches per probe (B_big = this x B_small)")
    p.add_argument("--probe-beta", type=float, default=0.95, help="EMA factor of the estimate (per probe)")
    p.add_argument("--replica-batch", type=int, default=32, help="images per simulated replica (group BN)")
    p.add_argument("--bn-groups", default="1,4", help="replicas per BN group (plus the whole batch, from the grid)")
    p.add_argument("--bn-global-batch", type=int, default=4096)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--lower-targets", default="0.55,0.58,0.6,0.62",
                   help="further targets for steps to target, below batch 256's own (no extra runs)")
    p.add_argument("--report", action="store_true",
                   help="no training: analyse the runs already in --out again, print the tables, redraw the plot")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "large_batch.json"))
    args = p.parse_args(argv)
    args.lower_targets_list = [float(t) for t in args.lower_targets.split(",") if t]
    if args.report:
        return report_only(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)

    t_load = time.perf_counter()
    try:
        full = load_dataset(args.data)
    except HastenError as exc:
        print(f"benchmarks/large_batch.py: error: {exc} (pass --data PATH or set HASTEN_DATA)", file=sys.stderr)
        return 2
    factor = full.train.images.shape[-1] // args.resolution
    X, Y, mean, std = prepare(full.train, factor)
    Xt, Yt, _, _ = prepare(full.test, factor, mean, std)
    data = {"X": X, "Y": Y, "Xt": Xt, "Yt": Yt}
    n_params = sum(p.numel() for p in SmallNet(args.resolution, args.width, args.hidden).parameters())
    print(f"{full.summary()}; pooled to {args.resolution}x{args.resolution} in {time.perf_counter() - t_load:.1f} s",
          file=sys.stderr)

    out = Path(args.out)
    results = {"benchmark": "large_batch", "runs": []}
    old = load_results(out)
    if old and old.get("version") == 2:
        results = old
    results.update({
        "version": 2,
        "scale": "small-scale CPU experiment (not the GPU-scale experiment)",
        "dataset": f"{full.name}, all {len(X)} training images, pooled to {args.resolution}x{args.resolution}, "
                   f"full test set ({len(Xt)} images)",
        "network": f"SmallNet: conv3x3 3->{args.width} BN ReLU maxpool2, FC {args.width * (args.resolution // 2) ** 2}"
                   f"->{args.hidden} BN ReLU, FC {args.hidden}->10 ({n_params} parameters)",
        "args": {**vars(args), "out": os.path.relpath(args.out)},
    })
    done = {r["key"] for r in results["runs"]}
    wall = results.setdefault("wall_s", [])  # one entry per invocation
    t_start = time.perf_counter()
    timing: dict[int, list[float]] = {}
    for r in results["runs"]:
        timing.setdefault(r["batch"], []).append(r["time_s"] / r["epochs"])

    def run_all(cfgs: list[dict], phase: str) -> None:
        todo = [c for c in cfgs if key_of(c) not in done]
        if not todo:
            return
        print(f"{phase}: {len(todo)} runs ({len(cfgs) - len(todo)} already in {out})", file=sys.stderr, flush=True)
        by_cfg = {}
        for c in todo:
            by_cfg.setdefault(key_of({**c, "seed": -1}), []).append(c)
        order = [by_cfg[k][rep] for rep, k in interleaved(sorted(by_cfg), max(len(v) for v in by_cfg.values()),
                                                           seed=len(done))
                 if rep < len(by_cfg[k])]
        for i, c in enumerate(order):
            rec = train_run(c, data, args)
            rec["key"] = key_of(c)
            results["runs"].append(rec)
            done.add(rec["key"])
            timing.setdefault(c["batch"], []).append(rec["time_s"] / c["epochs"])
            results["wall_s_this_invocation"] = time.perf_counter() - t_start
            write_results(out, results, EXACT)
            per_epoch = statistics.mean(x for v in timing.values() for x in v)
            left = sum(statistics.mean(timing.get(o["batch"], [per_epoch])) * o["epochs"] for o in order[i + 1:])
            print(f"  [{phase} {i + 1}/{len(order)}] {rec['key']:<40} acc {rec['accuracy']:.4f} "
                  f"B_simple {rec['noise_scale']['final']:8.1f}  {rec['time_s']:.0f} s (probe {rec['probe_s']:.1f}, "
                  f"eval {rec['eval_s']:.1f}); elapsed {(time.perf_counter() - t_start) / 60:.1f} min, "
                  f"this phase ~{left / 60:.0f} min left", file=sys.stderr, flush=True)

    def cfg(part, b, opt, lr, seed, epochs=args.epochs, **kw):
        return {"part": part, "batch": b, "optimizer": opt, "peak_lr": lr, "seed": seed, "epochs": epochs, **kw}

    centres = {("sgd", b): args.sgd_lr * (b / 256) ** 0.5 for b in batches}
    centres.update({("lars", b): args.lars_lr * (b / 256) ** 0.25 for b in batches})
    lrs = {(b, o): grid(centres[(o, b)], args.grid_points) for b in batches for o in ("sgd", "lars")}
    # Earlier invocations' extensions are part of the grid.
    for r in results["runs"]:
        if r["part"] == "grid" and (r["batch"], r["optimizer"]) in lrs and r["peak_lr"] not in lrs[(r["batch"], r["optimizer"])]:
            lrs[(r["batch"], r["optimizer"])].append(r["peak_lr"])
    with MeasuredConditions("cpu") as cond:
        for round_ in range(args.max_extend + 1):
            run_all([cfg("grid", b, o, lr, s) for (b, o), ls in sorted(lrs.items()) for lr in ls for s in seeds],
                    "grid" if round_ == 0 else f"grid extension {round_}")
            a = analyse(results["runs"], args, seeds)
            grew = False
            for t in a["equal_epochs"]:
                ls = lrs[(t["batch"], t["optimizer"])]
                if t["best_at_edge"] == "low" and round_ < args.max_extend:
                    ls.append(round(min(ls) / 2, 6))
                    grew = True
                elif t["best_at_edge"] == "high" and round_ < args.max_extend:
                    ls.append(round(max(ls) * 2, 6))
                    grew = True
            if not grew:
                break
        a = analyse(results["runs"], args, seeds)
        # A second budget for batches that miss the target, at their best rate.
        if args.long_epochs and "target" in a:
            long = []
            for row in a["steps_to_target"]:
                if row["steps"] is None or row.get("part") == "long":
                    t = next(t for t in a["equal_epochs"] if t["batch"] == row["batch"]
                             and t["optimizer"] == row["optimizer"])
                    best_opt = max((x for x in a["equal_epochs"] if x["batch"] == row["batch"]),
                                   key=lambda x: x["accuracy"])
                    if t is best_opt:
                        long += [cfg("long", t["batch"], t["optimizer"], t["best_lr"], s, args.long_epochs)
                                 for s in seeds]
            run_all(long, "long budget")
        # Group BN at a large batch: SGD at that batch's tuned rate.
        sgd_rows = [t for t in a["equal_epochs"] if t["batch"] == args.bn_global_batch and t["optimizer"] == "sgd"]
        if sgd_rows and args.bn_groups:
            lr = sgd_rows[0]["best_lr"]
            bn = [cfg("bn", args.bn_global_batch, "sgd", lr, s, ghost=int(k) * args.replica_batch, bn_group=int(k))
                  for k in args.bn_groups.split(",") for s in seeds]
            run_all(bn, "group BN")
            # The whole batch (k = all replicas) is the grid's own run at that rate.
            for r in results["runs"]:
                if (r["part"] == "grid" and r["batch"] == args.bn_global_batch and r["optimizer"] == "sgd"
                        and r["peak_lr"] == lr and r["epochs"] == args.epochs):
                    twin = {**r, "part": "bn", "ghost": 0, "bn_group": args.bn_global_batch // args.replica_batch,
                            "key": "bn-twin " + r["key"]}
                    if twin["key"] not in done:
                        results["runs"].append(twin)
                        done.add(twin["key"])
    wall.append(time.perf_counter() - t_start)
    results["analysis"] = analyse(results["runs"], args, seeds)
    results["conditions"] = cond.as_dict()
    results["hardware"] = hardware_label(results["conditions"]["environment"])
    results["torch"] = torch.__version__
    results["total_run_s"] = sum(r["time_s"] for r in results["runs"] if not r["key"].startswith("bn-twin"))
    write_results(out, results, EXACT)
    print_tables(results)
    print(f"{results['hardware']}, torch {torch.__version__}; wall {sum(wall) / 60:.1f} min over {len(wall)} "
          f"invocation(s); {cond.summary()}")
    print(f"wrote {plot(results, out.with_suffix('.png'))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
