"""PNG plots for run directories and benchmarks (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def plot_curves(curves: Sequence[tuple[str, Sequence[float], Sequence[float]]], path: str | Path, *,
                xlabel: str, ylabel: str, title: str, hline: float | None = None,
                logx: bool = False, logy: bool = False) -> Path:
    """One line per (label, xs, ys); optional horizontal reference line."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, xs, ys in curves:
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(curves) > 1:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_bars(labels: Sequence[str], values: Sequence[float], path: str | Path, *, xlabel: str, title: str) -> Path:
    """Horizontal bars, first label on top (for ablation ladders)."""
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.5), dpi=110)
    ax.barh(range(len(labels)), values)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)


def plot_allreduce(rows: Sequence[dict], path: str | Path, title: str) -> Path:
    """All-reduce time (measured; dashed: cost model) and busbw against message size,
    one line per algorithm (rows of ``hasten.recipes.allreduce.summarize``)."""
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for algo in dict.fromkeys(r["algo"] for r in rows):
        rs = [r for r in rows if r["algo"] == algo]
        xs = [r["bytes"] for r in rs]
        line, = ax_t.plot(xs, [r["time_s"] for r in rs], "o-", label=algo)
        if all(r["predicted_time_s"] for r in rs):
            ax_t.plot(xs, [r["predicted_time_s"] for r in rs], "--", color=line.get_color(), alpha=0.6)
        ax_b.plot(xs, [r["busbw_gbps"] for r in rs], "o-", label=algo)
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (s); dashed: cost model")
    ax_b.set_ylabel("busbw (GB/s)")
    ax_b.legend()
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def plot_echo_fresh_examples(rows: Sequence[dict], path: str | Path) -> Path:
    """Echo sweep (a): fresh examples to the target against e, one line per variant
    (rows of ``hasten.recipes.echo.report.summarize``, group "a")."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    base = next((r for r in rows if r["group"] == "a" and r["echo_factor"] == "1.0"), None)
    for variant in dict.fromkeys(r["variant"] for r in rows if r["group"] == "a" and r is not base):
        pts = [(1.0, base)] if base else []
        pts += [(float(r["echo_factor"]), r) for r in rows if r["group"] == "a" and r["variant"] == variant]
        pts = [(e, r) for e, r in pts if r["fresh_examples_to_target"]["mean"] is not None]
        if pts:
            ax.errorbar([e for e, _ in pts], [r["fresh_examples_to_target"]["mean"] for _, r in pts],
                        yerr=[r["fresh_examples_to_target"]["std"] or 0.0 for _, r in pts],  # None: one run
                        marker="o", capsize=3, label=variant)
    ax.set_xlabel("echo factor e")
    ax.set_ylabel("fresh examples to target")
    ax.set_title("(a) fresh examples to target vs echo factor")
    ax.legend()
    return save_figure(fig, path)


def plot_echo_speedup(rows: Sequence[dict], path: str | Path) -> Path:
    """Echo sweep (b): wall-time speedup against e at each upstream ratio R (groups
    "R=<r>"), fixed factors as lines, AutoEcho as a star at its mean e."""
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for group in dict.fromkeys(r["group"] for r in rows if r["group"].startswith("R=")):
        pts = [(float(r["echo_factor"]), r["speedup"]) for r in rows
               if r["group"] == group and r["echo_factor"] != "auto" and r["speedup"]]
        if not pts:
            continue
        base = next(r for r in rows if r["group"] == group and r["echo_factor"] == "1.0")
        measured = base["upstream_ratio"]["mean"]
        label = group + (f" (measured {measured:.1f})" if measured else "")
        line = ax.plot([e for e, _ in pts], [s for _, s in pts], marker="o", label=f"fixed e, {label}")[0]
        auto = next((r for r in rows if r["group"] == group and r["echo_factor"] == "auto" and r["speedup"]), None)
        if auto:
            ax.scatter([auto["mean_echo_factor"]["mean"]], [auto["speedup"]], marker="*", s=160,
                       color=line.get_color(), edgecolors="black", zorder=3, label=f"AutoEcho, {group}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("echo factor e (AutoEcho: its mean e)")
    ax.set_ylabel("wall-time speedup to target vs e = 1")
    ax.set_title("(b) speedup vs echo factor at upstream ratio R")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_large_batch(results: dict, path: str | Path) -> Path:
    """benchmarks/large_batch.py: accuracy against the global batch (SGD with linear
    scaling vs LARS) and against the BN batch of k simulated replicas, each point
    the mean over seeds with their range."""
    def spread(rs):
        return [[100 * (r["accuracy"] - r["accuracy_min"]) for r in rs],
                [100 * (r["accuracy_max"] - r["accuracy"]) for r in rs]]

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    # SGD's points are the best rate of its sweep at each batch (a tuned baseline), so
    # each is labelled with the multiple of the linear-scaling rule that won.
    for opt, label in [("sgd", "SGD + warm-up, best rate of the sweep (x linear scaling)"),
                       ("lars", "LARS (peak lr 10)")]:
        rs = [r for r in results["runs"] if r["part"] == "batch" and r["optimizer"] == opt]
        a.errorbar([r["batch"] for r in rs], [100 * r["accuracy"] for r in rs], yerr=spread(rs),
                   fmt="o-", capsize=3, label=label)
        for r in rs:
            if r.get("lr_factor") is not None:
                a.annotate(f"{r['lr_factor']:g}x", (r["batch"], 100 * r["accuracy"]), fontsize=7)
    a.set_xscale("log", base=2)
    a.set_xlabel("global batch (same epoch budget)")
    a.set_ylabel("test accuracy (%)")
    a.set_title("Batch size: SGD vs LARS")
    a.legend()
    rs = [r for r in results["runs"] if r["part"] == "bn"]
    b.errorbar([r["bn_batch"] for r in rs], [100 * r["accuracy"] for r in rs], yerr=spread(rs), fmt="s-", capsize=3)
    for r in rs:
        b.annotate(f"k={r['bn_group']}", (r["bn_batch"], 100 * r["accuracy"]))
    b.set_xscale("log", base=2)
    b.set_xlabel("BN batch = k replicas x 16 images")
    b.set_title("BN group size (simulated replicas)")
    fig.suptitle(f"{results['dataset']}; mean and range of {results['n_runs_per_config']} seed(s)\n"
                 f"{results['scale']}", fontsize=8)
    return save_figure(fig, path)


def plot_bars_with_spread(labels: Sequence[str], means: Sequence[float], spreads: Sequence[float],
                          path: str | Path, *, ylabel: str, title: str) -> Path:
    """Vertical bars with error bars, one per configuration (throughput tables); a spread
    of None (one run: no spread measured) draws no error bar."""
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.bar(labels, means, yerr=[s or 0.0 for s in spreads], capsize=4)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
