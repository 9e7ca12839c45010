"""What benchmarks/large_batch.py shows of its analysis: the printed tables and the figure
(steps to target against batch, accuracy at equal epochs, group BN)."""

from __future__ import annotations

from pathlib import Path


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
