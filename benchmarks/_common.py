"""What every benchmark in this folder needs, defined once (two copies gave two answers):

- the statistics: ``hasten.stats`` (mean, sample std, the exact Student-t 95% interval,
  paired differences and ratios), re-exported;
- ``--data``: ``add_data_argument`` and ``require_data``; ``$HASTEN_DATA`` if set, else
  CIFAR-10-JPEG at ``../shared/data/cifar10-jpeg.tar.xz`` beside the checkout;
- ``RESULTS``: benchmarks/results/, where each benchmark writes its JSON;
- ``plus_minus``: "mean ± spread" for the printed tables (the mean alone for one run);
- the conditions block: ``MeasuredConditions`` around the measurement, its
  ``cond.as_dict()`` under "conditions" in the JSON, ``hardware_label`` for the table;
- ``memory_bytes``: the PSS and RSS of processes (a loader and its workers: with
  ``hasten.cpu_time.descendants``), from /proc.

The scripts run as ``python benchmarks/<name>.py``, which puts this folder on sys.path:
``from _common import ...``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hasten.environment import MeasuredConditions, hardware_label
from hasten.stats import (describe, mean, mean_ci, paired, paired_differences, paired_ratios, sample_std,
                          t_quantile)

__all__ = ["BENCHMARKS", "RESULTS", "DEFAULT_DATA", "add_data_argument", "require_data", "plus_minus",
           "MeasuredConditions", "hardware_label", "describe", "mean", "mean_ci", "memory_bytes", "paired",
           "paired_differences", "paired_ratios", "sample_std", "t_quantile"]

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"

# Beside the checkout, wherever the benchmark is started from, and written relative to the
# working directory: from the checkout's root it is ../shared/data/cifar10-jpeg.tar.xz, as
# the results record it, and no machine's absolute path reaches a result.
DEFAULT_DATA = os.path.relpath(BENCHMARKS.parent.parent / "shared" / "data" / "cifar10-jpeg.tar.xz")


def add_data_argument(parser: argparse.ArgumentParser, what: str = "CIFAR-10-JPEG archive or folder") -> None:
    """``--data``: ``$HASTEN_DATA`` if set (and not empty), else ``DEFAULT_DATA``."""
    parser.add_argument("--data", default=os.environ.get("HASTEN_DATA") or DEFAULT_DATA,
                        help=f"{what} (default $HASTEN_DATA, else {DEFAULT_DATA})")


def require_data(path: str | os.PathLike, prog: str) -> None:
    """Stop with one line when ``path`` does not exist."""
    if not os.path.exists(path):
        raise SystemExit(f"{prog}: no data at {path}; pass --data PATH or set HASTEN_DATA")


def plus_minus(value: float, spread: float | None, spec: str = ".2f") -> str:
    """``value ± spread``, both in ``spec``; the value alone when there is no spread (None:
    one run, ``hasten.stats.sample_std``)."""
    return f"{value:{spec}} ± {spread:{spec}}" if spread is not None else f"{value:{spec}}"


def memory_bytes(pids: list[int]) -> tuple[int, int]:
    """(PSS, RSS) summed over the processes, from /proc/<pid>/smaps_rollup (0 for one that is
    gone). PSS splits each shared page among its sharers (forked workers share much with
    their parent), so the sum is what the processes hold together; RSS counts a shared page
    once per process, so its sum is more than that."""
    pss = rss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            pass  # gone meanwhile
    return pss, rss
