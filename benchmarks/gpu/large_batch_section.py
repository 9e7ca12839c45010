"""Large-batch training on the GPU: ResNet-18 on the full training set at global batch
512 / 2048 / 8192, SGD with the linear scaling rule and warm-up (Goyal et al.) against
LARS (You et al.) at its reference peak, all with the same epoch budget, n seeds,
interleaved; plus batch norm over small groups at a small per-replica batch.

Through ``hasten.recipes.train.train`` (what ``hasten train`` runs), bf16 autocast and
channels_last on CUDA, the dataset resident on the device. SGD runs at Goyal et al.'s
reference rate (0.1 per 256 images, scaled linearly), untuned here: the CPU experiment
(benchmarks/large_batch.py) sweeps it; this budget does not.

Epochs: as many as the section's budget allows at the throughput measured first
(``lb_epochs_range`` clamps it), the same for every configuration; batch 8192 takes
50,000 // 8192 = 6 steps per epoch, so a few hundred steps need 33+ epochs, more than
20 minutes of one H100 hold next to everything else: the JSON records the steps.

Group BN: R replicas of b images with groups of k replicas normalise over k*b images;
on one process that is ghost batch norm with virtual batches of k*b images over the
global batch (the statistics are the same as ``GroupBatchNorm``'s, tested in
tests/test_nn_group_bn.py; only the running averages differ), as in benchmarks/large_batch.py.
"""

from __future__ import annotations

import math
import time

from _common import mean, sample_std
from hasten.recipes.train import DEFAULT_BASE_LR, DEFAULT_LR_SCALING, TrainConfig, train
from hasten.timing import interleaved

RUN_OVERHEAD_S = 3.0  # per run: building the model, cuDNN autotuning a new batch shape, the test evaluation


def plan_configs(s) -> tuple[list, dict]:
    """``(label, part, TrainConfig fields)`` to run, and the BN labels that reuse a batch config."""
    configs = []
    for batch in s.lb_batches:
        for opt in ("sgd", "lars"):
            configs.append((f"batch {batch} {opt}", "batch",
                            dict(batch_size=batch, optimizer=opt, lr=DEFAULT_BASE_LR[opt],
                                 lr_scaling=DEFAULT_LR_SCALING[opt])))
    same_as = {}
    for k in s.lb_bn_groups:
        bn_batch = k * s.lb_replica_batch
        kw = dict(batch_size=s.lb_bn_global_batch, optimizer="sgd", lr=DEFAULT_BASE_LR["sgd"],
                  lr_scaling=DEFAULT_LR_SCALING["sgd"])
        if bn_batch < s.lb_bn_global_batch:
            kw["ghost_batch"] = bn_batch
        label = f"bn group {k} ({bn_batch} images per BN)"
        twin = next((lab for lab, _, other in configs if other == kw), None)
        if twin is not None:
            same_as[label] = twin
        else:
            configs.append((label, "bn", kw))
    return configs, same_as


def choose_epochs(ctx, n_runs: int, train_images: int) -> tuple[float, dict]:
    """The plan's epochs, else as many as fit the budget at the measured throughput."""
    s = ctx.sizes
    if s.lb_epochs is not None:
        return s.lb_epochs, {"rule": "fixed by the plan"}
    from large_batch_precision import (
        images_per_s,  # benchmarks/: the same training step, timed
    )

    cuda = ctx.device.type == "cuda"
    ips = images_per_s(ctx.device, "resnet18", s.lb_width, 32, 512, cuda, cuda, 5, 20)
    lo, hi = s.lb_epochs_range
    epochs = epochs_for_budget(ctx.time_left(), ips, n_runs, train_images, lo, hi)
    return epochs, {"rule": f"fit the budget at {ips:.0f} images/s (batch 512 probe), clamped to {lo:g}..{hi:g}",
                    "probe_images_per_s": ips}


def epochs_for_budget(seconds: float, images_per_s: float, n_runs: int, train_images: int,
                      lo: float, hi: float) -> float:
    """Whole epochs per run such that ``n_runs`` runs fit ``seconds`` at ``images_per_s``,
    within ``[lo, hi]``. 0.8: larger batches run faster than the probe, ghost BN slower;
    the per-run fixed costs are ``RUN_OVERHEAD_S``."""
    images = max(seconds - n_runs * RUN_OVERHEAD_S, 0) * images_per_s * 0.8
    return float(min(max(math.floor(images / (n_runs * train_images)), lo), hi))


def large_batch(ctx) -> dict:
    s, data = ctx.sizes, ctx.dataset()
    configs, same_as = plan_configs(s)
    n_train = len(data.train)
    epochs, rule = choose_epochs(ctx, len(configs) * s.lb_seeds, n_train)
    cuda = ctx.device.type == "cuda"
    common = dict(model="resnet18", width=s.lb_width, epochs=epochs,
                  warmup_epochs=min(s.lb_warmup_epochs, epochs / 4), bf16=cuda, channels_last=cuda,
                  device=ctx.device.type, loader="device")
    ctx.say(f"  {len(configs)} configurations x {s.lb_seeds} seeds, {epochs:g} epochs ({rule['rule']})")
    results: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    order, cut_short, per_run = [], False, 0.0
    for seed, (label, part, kw) in interleaved(configs, s.lb_seeds, seed=0):
        if order and not ctx.can_start(per_run):
            cut_short = True
            break
        t0 = time.perf_counter()
        r = train(TrainConfig(**common, **kw, seed=seed), dataset=data)
        per_run = max(per_run, time.perf_counter() - t0)
        results[label].append({k: r[k] for k in ("accuracy", "steps", "time_s", "images_per_s", "peak_lr")}
                              | {"seed": seed})
        order.append([seed, label])
        ctx.say(f"  seed {seed} {label:<28} {r['accuracy']:.4f} after {r['steps']} steps ({r['time_s']:.1f} s)")
        ctx.checkpoint({"epochs": epochs, "runs_so_far": results})

    rows = []
    for label, part, kw in configs + [(lab, "bn", None) for lab in same_as]:
        rs = results[same_as.get(label, label)]
        kw = kw or next(k for lab, _, k in configs if lab == same_as[label])
        accs = [r["accuracy"] for r in rs]
        rows.append({"config": label, "part": part, "same_runs_as": same_as.get(label),
                     "batch": kw["batch_size"], "optimizer": kw["optimizer"],
                     "bn_batch": kw.get("ghost_batch") or kw["batch_size"],
                     "steps": rs[0]["steps"] if rs else None, "peak_lr": rs[0]["peak_lr"] if rs else None,
                     "n_runs": len(rs), "accuracy": mean(accs), "accuracy_std": sample_std(accs),
                     "accuracy_runs": [r["accuracy"] for r in rs],
                     "time_s": mean(r["time_s"] for r in rs),
                     "images_per_s": mean(r["images_per_s"] for r in rs)})
    by = {r["config"]: r for r in rows}
    lo_b, hi_b = min(s.lb_batches), max(s.lb_batches)

    def acc(label):
        a = by[label]["accuracy"]
        return f"{a:.2%}" if a is not None else "-"

    n = min(r["n_runs"] for r in rows)
    key = (f"batch {hi_b}: LARS {acc(f'batch {hi_b} lars')}, SGD {acc(f'batch {hi_b} sgd')}; "
           f"batch {lo_b} SGD {acc(f'batch {lo_b} sgd')} ({by[f'batch {hi_b} sgd']['steps']} steps at {hi_b})")
    spreads = [r["accuracy_std"] for r in rows if r["accuracy_std"] is not None]
    return {"model": "resnet18", "width": s.lb_width, "data": data.name, "train_images": n_train,
            "epochs": epochs, "epochs_rule": rule, "common": common, "n_runs": n, "n_planned": s.lb_seeds,
            "cut_short": cut_short, "order": order, "rows": rows,
            "timed": "hasten.recipes.train: training steps (time_s); accuracy on the full test split",
            "headline": {"key": key, "n": n, "spread": f"max std {100 * max(spreads, default=0):.2f} pt"}}
