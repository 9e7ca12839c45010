"""What every benchmark in this folder needs, defined once (two copies gave two answers):

- the statistics: ``hasten.stats`` (mean, sample std, the exact Student-t 95% interval,
  paired differences and ratios), re-exported;
- ``--data``: ``add_data_argument`` and ``require_data``; ``$HASTEN_DATA`` if set, else
  CIFAR-10-JPEG at ``../shared/data/cifar10-jpeg.tar.xz`` beside the checkout;
- ``RESULTS``: benchmarks/results/, where each benchmark writes its JSON;
- ``plus_minus``: "mean ± spread" for the printed tables (the mean alone for one run);
- the conditions block: ``MeasuredConditions`` around the measurement, its
  ``cond.as_dict()`` under "conditions" in the JSON, ``hardware_label`` for the table;
- the results' two files: ``write_results`` puts a benchmark's summary (conditions,
  per-configuration statistics, goals) in ``NAME.json``, indented for a person to read, and
  its raw runs in ``NAME.runs.jsonl.gz``, one run a line, floats rounded to 4 significant
  digits (a timing on a shared machine has no fifth); ``load_results`` puts them together
  again, so a benchmark resumes from them (tests/test_results_budget.py keeps each file small).
- ``memory_bytes``: the PSS and RSS of processes (a loader and its workers: with
  ``hasten.cpu_time.descendants``), from /proc;
- ``ProcessRng``: a baseline dataset's random generator, one per DataLoader worker.

The scripts run as ``python benchmarks/<name>.py``, which puts this folder on sys.path:
``from _common import ...``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
from pathlib import Path

from hasten.environment import MeasuredConditions, hardware_label
from hasten.stats import (describe, mean, mean_ci, paired, paired_differences, paired_ratios, sample_std,
                          t_quantile)

__all__ = ["BENCHMARKS", "RESULTS", "DEFAULT_DATA", "add_data_argument", "require_data", "plus_minus",
           "MeasuredConditions", "hardware_label", "describe", "mean", "mean_ci", "paired", "paired_differences",
           "paired_ratios", "sample_std", "t_quantile", "SIGNIFICANT_DIGITS", "rounded", "runs_path",
           "write_results", "load_results", "memory_bytes", "ProcessRng"]

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


SIGNIFICANT_DIGITS = 4


def rounded(obj, digits: int = SIGNIFICANT_DIGITS, exact: frozenset[str] = frozenset()):
    """``obj`` with every float rounded to ``digits`` significant digits, except the values of
    the keys in ``exact``: settings that name a run (a learning rate of 7.071068 is how a resumed
    grid finds it again). numpy and torch scalars become Python numbers; inf and nan become None,
    as ``hasten.rundir.write_json`` writes them (JSON has neither)."""
    if hasattr(obj, "item") and not isinstance(obj, (dict, list, tuple)):
        obj = obj.item()
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: v if k in exact else rounded(v, digits, exact) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits, exact) for v in obj]
    return obj


def runs_path(out: str | os.PathLike) -> Path:
    """``NAME.runs.jsonl.gz`` beside the summary ``NAME.json``."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".json") + ".runs.jsonl.gz")


def readable_json(obj, indent: str = "", width: int = 100) -> str:
    """JSON indented one space a level, with any list or object that fits in ``width``
    characters on one line: a summary a person reads, not one number per line."""
    flat = json.dumps(obj, separators=(", ", ": "), default=str)
    if len(flat) + len(indent) <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(str(k))}: {readable_json(v, inner, width).lstrip()}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + readable_json(v, inner, width).lstrip() for v in obj) + "\n" + indent + "]"


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_results(out: str | os.PathLike, results: dict, exact: frozenset[str] = frozenset()) -> Path:
    """``results`` without its "runs" to ``out`` (indented JSON, with "runs_file" naming the
    raw runs), and the runs (if any) one a line to ``runs_path(out)``, both rounded (``rounded``, the
    keys in ``exact`` as they are); each file written whole and renamed into place, so a
    benchmark stopped mid-write leaves the last good pair."""
    runs = results.get("runs", [])
    raw = runs_path(out)
    raw.parent.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in results.items() if k != "runs"}
    if runs:  # (a benchmark whose summary holds every repeat writes no empty runs file)
        lines = "".join(json.dumps(rounded(run, exact=exact), separators=(",", ":"), default=str) + "\n"
                        for run in runs)
        # mtime=0: the same runs give the same bytes, so a rewrite of unchanged runs is no diff in git
        _replace(raw, gzip.compress(lines.encode(), mtime=0))
        summary["runs_file"] = raw.name
    _replace(Path(out), (readable_json(rounded(summary, exact=exact)) + "\n").encode())
    return Path(out)


def load_results(out: str | os.PathLike) -> dict | None:
    """The summary at ``out`` with its raw runs under "runs" again; None when there is none."""
    out = Path(out)
    if not out.exists():
        return None
    results = json.loads(out.read_text())
    raw = runs_path(out)
    results.pop("runs_file", None)
    if raw.exists():
        with gzip.open(raw, "rt") as f:
            results["runs"] = [json.loads(line) for line in f if line.strip()]
    else:
        results.setdefault("runs", [])
    return results
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


class ProcessRng:
    """A numpy generator per process, made on first use and seeded with torch's seed: a dataset's
    DataLoader workers are forked copies of it, and torch seeds each worker apart, so each worker
    draws its own crops (one generator made in the parent would give every worker the same)."""

    def __init__(self) -> None:
        self._rng, self._pid = None, None

    def __call__(self):
        if self._pid != os.getpid():
            import numpy as np
            import torch
            self._rng, self._pid = np.random.default_rng(torch.initial_seed()), os.getpid()
        return self._rng
