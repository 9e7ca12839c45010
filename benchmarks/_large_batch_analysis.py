"""The analysis of benchmarks/large_batch.py, from the runs alone (so a rerun or ``--report``
recomputes it): the best learning rate per batch and optimizer at equal epochs, the target and
the steps to it against batch with perfect scaling, the noise scale from the raw probes, and
group BN."""

from __future__ import annotations

import math
import statistics

from hasten.optim.noise_scale import NoiseScale


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
