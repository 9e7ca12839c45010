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

    python benchmarks/large_batch.py                                       # about 75 min on one core
    python benchmarks/large_batch.py --epochs 2 --batches 256,1024 --grid-points 2 --max-extend 0 \\
        --seeds 0 --bn-groups 1 --long-epochs 0 --out /tmp/lb-smoke.json    # smoke, 1 min
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hasten.data import load_dataset
from hasten.errors import HastenError
from hasten.nn.ghost_bn import apply_ghost_batchnorm
from hasten.optim import Lars, WarmupPolyDecay, lars_param_groups
from hasten.optim.noise_scale import NoiseScale, micro_batch_sq_norms
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, hardware_label, load_results, write_results

LABEL_SMOOTHING, WEIGHT_DECAY, MOMENTUM, TRUST = 0.1, 5e-4, 0.9, 0.001


class SmallNet(nn.Module):
    """conv3x3(3->w) BN ReLU maxpool2, FC(w*(r/2)^2 -> h) BN ReLU, FC(h -> 10)."""

    def __init__(self, resolution: int = 8, width: int = 16, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.fc1 = nn.Linear(width * (resolution // 2) ** 2, hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv(x))), 2)
        x = self.fc1(x.flatten(1))[:, :, None, None]
        return self.fc2(F.relu(self.bn2(x)).flatten(1))


def prepare(split, factor: int, mean=None, std=None):
    x = split.images.float()
    if factor > 1:
        x = F.avg_pool2d(x, factor)
    if mean is None:
        mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    return ((x - mean) / std).contiguous(), split.labels.long(), mean, std


def loss_fn(logits, y):
    return F.cross_entropy(logits, y, label_smoothing=LABEL_SMOOTHING)


@torch.no_grad()
def accuracy(model, x, y, chunk=5000):
    model.eval()
    correct = sum(int((model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum()) for i in range(0, len(x), chunk))
    model.train()
    return correct / len(x)


def flip(x, gen):
    mask = torch.rand(len(x), 1, 1, 1, generator=gen) < 0.5
    return torch.where(mask, x.flip(3), x)


def train_run(cfg: dict, data: dict, args) -> dict:
    """One run of ``cfg`` (batch, optimizer, peak_lr, seed, epochs, ghost); returns its record."""
    X, Y, Xt, Yt = data["X"], data["Y"], data["Xt"], data["Yt"]
    torch.manual_seed(cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    probe_gen = torch.Generator().manual_seed(10_000 + cfg["seed"])
    model = SmallNet(args.resolution, args.width, args.hidden)
    if cfg.get("ghost"):
        apply_ghost_batchnorm(model, cfg["ghost"])
    groups = lars_param_groups(model, WEIGHT_DECAY)
    if cfg["optimizer"] == "lars":
        opt = Lars(groups, lr=cfg["peak_lr"], momentum=MOMENTUM, trust_coefficient=TRUST)
    else:
        for g in groups:
            g.pop("adapt", None)
        opt = torch.optim.SGD(groups, lr=cfg["peak_lr"], momentum=MOMENTUM, nesterov=True)
    B, n = cfg["batch"], len(X)
    spe = n // B
    total = round(cfg["epochs"] * spe)
    warmup = min(round(args.warmup_epochs * spe), total - 1)
    sched = WarmupPolyDecay(opt, warmup, total, power=2.0)
    probe_every = max(1, round(args.probe_images / B))
    est = NoiseScale(beta=args.probe_beta)
    n_probe = args.probe_batch * args.probe_micro
    curve, noise, raw, step, probe_s, eval_s, diverged = [], [], [], 0, 0.0, 0.0, False
    t0 = time.perf_counter()
    epochs = math.ceil(cfg["epochs"])
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(spe):
            if step >= total:
                break
            idx = perm[i * B:(i + 1) * B]
            xb, yb = flip(X[idx], gen), Y[idx]
            loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % probe_every == 0:
                tp = time.perf_counter()
                pidx = torch.randint(0, n, (n_probe,), generator=probe_gen)
                px, py = flip(X[pidx], probe_gen), Y[pidx]
                small, big = micro_batch_sq_norms(model, loss_fn, list(zip(px.split(args.probe_batch),
                                                                           py.split(args.probe_batch))))
                est.update(small, big, args.probe_batch, n_probe, step)
                raw.append([step, small, big])
                probe_s += time.perf_counter() - tp
        if not math.isfinite(loss.item()):
            diverged = True
            curve.append([step, (epoch + 1), 0.1])
            break
        last = epoch + 1 == epochs
        if last or epoch + 1 > epochs / 2 or (epoch + 1) % 2 == 0:
            te = time.perf_counter()
            curve.append([step, round(step / spe, 4), accuracy(model, Xt, Yt)])
            eval_s += time.perf_counter() - te
            noise.append([step, est.b_simple, est.g2, est.trace])
    time_s = time.perf_counter() - t0
    return {**cfg, "steps": step, "total_steps": total, "warmup_steps": warmup, "steps_per_epoch": spe,
            "accuracy": curve[-1][2], "curve": curve, "diverged": diverged,
            "noise_scale": {"final": est.b_simple, "g2": est.g2, "trace": est.trace, "curve": noise,
                            "probes": est.updates, "b_small": args.probe_batch, "b_big": n_probe,
                            "raw": raw},
            "time_s": time_s, "probe_s": probe_s, "eval_s": eval_s}


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


# ----------------------------------------------------------------------------
# Analysis (from the runs alone, so a rerun recomputes it)
# ----------------------------------------------------------------------------

def configs_of(runs, part="grid", epochs=None):
    """{(batch, optimizer, peak_lr): [runs over seeds]} of one part."""
    out = {}
    for r in runs:
        if r["part"] == part and (epochs is None or r["epochs"] == epochs):
            k = (r["batch"], r["optimizer"], r["peak_lr"]) + ((r["bn_group"],) if part == "bn" else ())
            out.setdefault(k, []).append(r)
    return out


def mean_acc(rs):
    return statistics.mean(r["accuracy"] for r in rs)


def first_reach(curve, target):
    return next((s for s, _, a in curve if a >= target), None)


def steps_to(rs, target):
    steps = [first_reach(r["curve"], target) for r in rs]
    return None if any(s is None for s in steps) else statistics.mean(steps)


def best_by_accuracy(cfgs, batch, opt):
    cands = {k: v for k, v in cfgs.items() if k[0] == batch and k[1] == opt}
    if not cands:
        return None, None
    k = max(cands, key=lambda k: mean_acc(cands[k]))
    return k, cands[k]


def noise_of(run, parts: int = 10) -> dict:
    """B_simple of one run from its raw probes: over the run, its second half, each tenth."""
    ns = run["noise_scale"]
    b, B = ns["b_small"], ns["b_big"]

    def ratio(rows):
        est = [NoiseScale.unbiased(small, big, b, B) for _, small, big in rows]
        g2 = sum(e[0] for e in est)
        return sum(e[1] for e in est) / g2 if est and g2 > 0 else math.nan

    raw, total = ns["raw"], run["total_steps"]
    return {"run": ratio(raw), "second_half": ratio([x for x in raw if x[0] > total / 2]),
            "end_ema": ns["final"],
            "by_tenth": [ratio([x for x in raw if i * total / parts < x[0] <= (i + 1) * total / parts])
                         for i in range(parts)]}


def scaling_at(runs, target: float, batches: list[int], seeds) -> dict:
    """Steps to ``target`` against batch: the best (optimizer, learning rate) of each batch
    over the grid and long-budget runs, perfect scaling from the smallest batch, the ratio to
    it, and where the curve first passes 2x of perfect scaling."""
    stt = []
    for b in batches:
        for opt in ("sgd", "lars"):
            best = None
            for part in ("grid", "long"):
                for (bb, oo, lr), rs in configs_of(runs, part).items():
                    if bb != b or oo != opt or len(rs) < len(seeds):
                        continue
                    s = steps_to(rs, target)
                    if s is not None and (best is None or s < best["steps"]):
                        best = {"batch": b, "optimizer": opt, "peak_lr": lr, "steps": s, "epochs": rs[0]["epochs"],
                                "steps_runs": [first_reach(r["curve"], target) for r in rs], "part": part}
            stt.append(best or {"batch": b, "optimizer": opt, "steps": None})
    out = {"steps_to_target": stt}
    reached = {}
    for row in stt:
        if row["steps"] is not None:
            reached[row["batch"]] = min(reached.get(row["batch"], math.inf), row["steps"])
    out["steps_to_target_best"] = {str(b): reached.get(b) for b in batches}
    base = batches[0]
    if base in reached:
        perfect = {str(b): reached[base] * base / b for b in batches}
        out["perfect_scaling"] = perfect
        out["ratio_to_perfect"] = {str(b): (reached[b] / perfect[str(b)] if b in reached else None) for b in batches}
        # Where the measured curve leaves perfect scaling: the first batch whose steps exceed
        # 2x the perfect line (or that misses the target), interpolated in log batch.
        leave = None
        prev = base
        for b in batches[1:]:
            ratio = out["ratio_to_perfect"][str(b)]
            if ratio is None or ratio > 2:
                r_prev = out["ratio_to_perfect"][str(prev)]
                if ratio is None or r_prev is None or r_prev >= 2:
                    leave = {"batch": b, "how": "first batch past 2x of perfect scaling or missing the target",
                             "between": [prev, b]}
                else:
                    f = (math.log(2) - math.log(r_prev)) / (math.log(ratio) - math.log(r_prev))
                    leave = {"batch": round(prev * (b / prev) ** f), "between": [prev, b],
                             "how": "log-interpolated batch where steps reach 2x of perfect scaling"}
                break
            prev = b
        out["leaves_perfect_scaling"] = leave or {"batch": None, "how": "within 2x of perfect scaling at every batch"}
    return out


def analyse(runs, args, seeds) -> dict:
    grid_cfgs = configs_of(runs, "grid", args.epochs)
    batches = sorted({k[0] for k in grid_cfgs})
    table, edge = [], {}
    for b in batches:
        for opt in ("sgd", "lars"):
            lrs = sorted(k[2] for k in grid_cfgs if k[0] == b and k[1] == opt)
            if not lrs:
                continue
            k, rs = best_by_accuracy(grid_cfgs, b, opt)
            edge[(b, opt)] = (k[2] == lrs[0] and "low") or (k[2] == lrs[-1] and "high") or None
            table.append({"batch": b, "optimizer": opt, "grid": lrs,
                          "accuracy_by_lr": {f"{lr:g}": [r["accuracy"] for r in grid_cfgs[(b, opt, lr)]]
                                             for lr in lrs},
                          "best_lr": k[2], "accuracy": mean_acc(rs), "accuracy_runs": [r["accuracy"] for r in rs],
                          "best_at_edge": edge[(b, opt)], "steps": rs[0]["total_steps"]})
    out = {"equal_epochs": table}
    base = min(batches) if batches else None
    base_rows = [t for t in table if t["batch"] == base]
    if not base_rows:
        return out
    base_best = max(base_rows, key=lambda t: t["accuracy"])
    target = min(base_best["accuracy_runs"])
    out["target"] = {"accuracy": target, "from": f"batch {base} {base_best['optimizer']} at peak lr "
                     f"{base_best['best_lr']:g} (the lower of its seeds' final accuracies)"}
    # Steps to target: the best learning rate of each (batch, optimizer), over every budget run.
    out.update(scaling_at(runs, target, batches, seeds))
    # Batch 256's own final accuracy favours batch 256 (the only batch that gets its many
    # steps within the epoch budget); Shallue et al. choose targets every batch reaches. The
    # same curves at such lower targets (no new runs: each run's curve is kept).
    out["lower_targets"] = [{"accuracy": t, **scaling_at(runs, t, batches, seeds)}
                            for t in getattr(args, "lower_targets_list", [])]
    # The noise scale, from each run's raw probe measurements: the ratio of the mean unbiased
    # tr(Sigma) to the mean unbiased |G|^2 over the whole run and over its second half (the
    # moving average at the very end is dominated by noise once |G|^2 is near 0).
    base_runs = configs_of(runs, "grid", args.epochs).get((base, base_best["optimizer"], base_best["best_lr"]), [])
    out["noise_scale"] = {"from": out["target"]["from"].split(" (")[0],
                          **{k: statistics.mean(noise_of(r)[k] for r in base_runs)
                             for k in ("run", "second_half", "end_ema")},
                          "runs": [noise_of(r) for r in base_runs],
                          "b_small": base_runs[0]["noise_scale"]["b_small"],
                          "b_big": base_runs[0]["noise_scale"]["b_big"]}
    out["noise_scale_all"] = [{"batch": k[0], "optimizer": k[1], "peak_lr": k[2],
                               **{q: statistics.mean(noise_of(r)[q] for r in rs) for q in ("run", "second_half")}}
                              for k, rs in sorted(grid_cfgs.items())]
    b8 = max(batches)
    best8 = max((t for t in table if t["batch"] == b8), key=lambda t: t["accuracy"])
    out["goals"] = {"largest_batch_gap_points": 100 * (base_best["accuracy"] - best8["accuracy"]),
                    "largest_batch": b8, "largest_batch_best": f"{best8['optimizer']} lr {best8['best_lr']:g}"}
    bn = configs_of(runs, "bn")
    out["bn"] = [{"bn_batch": r[0]["ghost"] or r[0]["batch"], "bn_group": r[0]["bn_group"], "peak_lr": k[2],
                  "accuracy": mean_acc(r), "accuracy_runs": [x["accuracy"] for x in r]}
                 for k, r in sorted(bn.items(), key=lambda kv: kv[1][0]["bn_group"])]
    return out


def plot(results: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hasten.plots import save_figure

    a = results["analysis"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2), dpi=120)
    batches = sorted({t["batch"] for t in a["equal_epochs"]})
    for opt, fmt in (("sgd", "o-"), ("lars", "s-")):
        rows = [r for r in a.get("steps_to_target", []) if r["optimizer"] == opt and r["steps"] is not None]
        ax1.plot([r["batch"] for r in rows], [r["steps"] for r in rows], fmt,
                 label={"sgd": "SGD + Nesterov", "lars": "LARS"}[opt])
        for r in rows:
            if r.get("part") == "long":
                ax1.annotate(f"{r['epochs']:g} ep", (r["batch"], r["steps"]), fontsize=7)
        missed = [r["batch"] for r in a.get("steps_to_target", []) if r["optimizer"] == opt and r["steps"] is None]
        if missed:
            top = max([r["steps"] for r in a["steps_to_target"] if r["steps"]] or [1])
            ax1.plot(missed, [top * 1.5] * len(missed), "x", color="C3" if opt == "sgd" else "C4",
                     label=f"{opt}: target not reached")
    if "perfect_scaling" in a:
        ax1.plot(batches, [a["perfect_scaling"][str(b)] for b in batches], "k--", lw=1, label="perfect scaling")
    for i, lt in enumerate(a.get("lower_targets", [])):
        colour = plt.cm.viridis(0.15 + 0.2 * i)
        pts = [(int(b), st) for b, st in lt["steps_to_target_best"].items() if st is not None]
        if pts:
            ax1.plot(*zip(*pts), "^-", color=colour, lw=1, ms=4, label=f"best of both, to {100 * lt['accuracy']:.0f}%")
        if "perfect_scaling" in lt:
            ax1.plot(batches, [lt["perfect_scaling"][str(b)] for b in batches], ":", color=colour, lw=0.8)
    ns = a.get("noise_scale")
    if ns:
        ax1.axvline(ns["run"], color="C2", lw=1, label=f"B_simple, whole run ({ns['run']:.0f})")
        ax1.axvline(ns["second_half"], color="C2", lw=1, ls=":",
                    label=f"B_simple, second half ({ns['second_half']:.0f})")
    leave = a.get("leaves_perfect_scaling", {}).get("batch")
    if leave:
        ax1.axvline(leave, color="C3", lw=1, ls="-.", label=f"to the first target: past 2x of perfect by ~{leave}")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("global batch")
    ax1.set_ylabel("optimizer steps to the target test accuracy")
    ax1.set_title("Steps to target (best learning rate per batch; dotted: perfect scaling)", fontsize=9)
    ax1.legend(fontsize=6)
    for opt, fmt in (("sgd", "o-"), ("lars", "s-")):
        rows = [t for t in a["equal_epochs"] if t["optimizer"] == opt]
        ax2.errorbar([t["batch"] for t in rows], [100 * t["accuracy"] for t in rows],
                     yerr=[[100 * (t["accuracy"] - min(t["accuracy_runs"])) for t in rows],
                           [100 * (max(t["accuracy_runs"]) - t["accuracy"]) for t in rows]],
                     fmt=fmt, capsize=3, label={"sgd": "SGD + Nesterov, tuned", "lars": "LARS, tuned"}[opt])
        for t in rows:
            ax2.annotate(f"{t['best_lr']:g}", (t["batch"], 100 * t["accuracy"]), fontsize=7)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel(f"global batch ({results['args']['epochs']:g} epochs each)")
    ax2.set_ylabel("test accuracy (%)")
    ax2.set_title("Accuracy at equal epochs (best peak lr annotated)", fontsize=9)
    ax2.legend(fontsize=7)
    if a.get("bn"):
        ax3.errorbar([r["bn_batch"] for r in a["bn"]], [100 * r["accuracy"] for r in a["bn"]],
                     yerr=[[100 * (r["accuracy"] - min(r["accuracy_runs"])) for r in a["bn"]],
                           [100 * (max(r["accuracy_runs"]) - r["accuracy"]) for r in a["bn"]]], fmt="s-", capsize=3)
        for r in a["bn"]:
            ax3.annotate(f"k={r['bn_group']}", (r["bn_batch"], 100 * r["accuracy"]), fontsize=7)
        ax3.set_xscale("log", base=2)
        ax3.set_xlabel(f"BN batch = k replicas x {results['args']['replica_batch']} images")
        ax3.set_ylabel("test accuracy (%)")
        ax3.set_title(f"Group BN at global batch {results['args']['bn_global_batch']}", fontsize=9)
    fig.suptitle(f"{results['dataset']}; {results['network']}; mean of {len(results['args']['seeds'].split(','))} "
                 "seeds", fontsize=8)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------

def print_tables(results: dict) -> None:
    a = results["analysis"]
    print(f"target {100 * a['target']['accuracy']:.2f}% ({a['target']['from']})")
    print(f"{'batch':>6} {'opt':5} {'best lr':>8} {'edge':>5} {'steps':>6} {'acc (mean; seeds)':>26} {'steps to target':>16}")
    for t in a["equal_epochs"]:
        s = next(r for r in a["steps_to_target"] if r["batch"] == t["batch"] and r["optimizer"] == t["optimizer"])
        st = "missed" if s["steps"] is None else f"{s['steps']:.0f} ({s['epochs']:g} ep, lr {s['peak_lr']:g})"
        print(f"{t['batch']:6d} {t['optimizer']:5} {t['best_lr']:8.4g} {str(t['best_at_edge'] or '-'):>5} "
              f"{t['steps']:6d} {100 * t['accuracy']:8.2f}% " + " ".join(f"{100 * x:.2f}" for x in t["accuracy_runs"])
              + f"  {st}")
    ns = a["noise_scale"]
    print(f"noise scale B_simple ({ns['from']}): whole run {ns['run']:.0f}, second half {ns['second_half']:.0f}; "
          f"leaves perfect scaling: {a['leaves_perfect_scaling']}")
    for r in a["bn"]:
        print(f"BN group {r['bn_group']:4d} (BN batch {r['bn_batch']}): {100 * r['accuracy']:.2f}% "
              + " ".join(f"{100 * x:.2f}" for x in r["accuracy_runs"]))
    for lt in a.get("lower_targets", []):
        cells = []
        for b, st in lt["steps_to_target_best"].items():
            ratio = (lt.get("ratio_to_perfect") or {}).get(b)
            cells.append(f"{b}: " + ("missed" if st is None else f"{st:.0f}" + (f" (x{ratio:.2f})" if ratio else "")))
        print(f"steps to {100 * lt['accuracy']:.0f}% (x of perfect scaling): " + "; ".join(cells)
              + f"; leaves 2x at {lt.get('leaves_perfect_scaling', {}).get('batch')}")


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
