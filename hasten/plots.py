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
    return _save(fig, path)


def plot_bars(labels: Sequence[str], values: Sequence[float], path: str | Path, *, xlabel: str, title: str) -> Path:
    """Horizontal bars, first label on top (for ablation ladders)."""
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.5), dpi=110)
    ax.barh(range(len(labels)), values)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
