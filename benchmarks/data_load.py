"""Time ``load_dataset`` on CIFAR-10-JPEG: the first (decoding) and the later (cached) loads.

Measures, each first load in a fresh, empty cache directory:

- reading the archive alone, no decoding: with ``tarfile``'s own single-threaded
  decompression, and with ``iter_files`` (decompression in a read-ahead thread);
- first load, decoding in worker processes (the default: one per core);
- first load, decoding in the calling process only (``workers=1``), for the ratio;
- second load in the same process (cache hit: hash the archive, ``np.load``);
- second load in a fresh Python process, from interpreter start to tensors in
  memory (what a second ``hasten speedrun`` waits for before training).

Cached loads read from the OS page cache (the entry was just written), as a
second run on the same machine would. Within every repeat the variants run in a
freshly shuffled order (``hasten.timing.interleaved``); the load average and
matmul rate before and after are recorded (``hasten.environment.MeasuredConditions``).
Prints a table, writes
``benchmarks/results/data_load.json`` and ``data_load.png``.

    python benchmarks/data_load.py [--data PATH] [--first N] [--cached N]

``--data`` defaults to ``$HASTEN_DATA`` if set, else ``../shared/data/cifar10-jpeg.tar.xz``
beside the checkout (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from hasten.cpu_time import own_cpu_s
from hasten.data import load_dataset
from hasten.data.archive import iter_files
from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, hardware_label, mean, require_data, sample_std

FRESH_PROCESS = """
import sys, time
t0 = time.perf_counter()
from hasten.data import load_dataset
t1 = time.perf_counter()
ds = load_dataset(sys.argv[1])
assert ds.cached, "expected a cache hit"
print(t1 - t0, time.perf_counter() - t1)
"""


def timed_load(data: Path, cache: Path, **kwargs) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds, dataset) of one load with ``cache`` as the cache directory."""
    os.environ["HASTEN_CACHE"] = str(cache)
    start, cpu = time.perf_counter(), own_cpu_s()
    ds = load_dataset(data, **kwargs)
    return time.perf_counter() - start, own_cpu_s() - cpu, ds


def read_with_tarfile(path: Path) -> int:
    """The baseline for reading: tarfile's own stream decompression, one thread."""
    total = 0
    with tarfile.open(path, "r|*") as tf:
        for member in tf:
            if member.isreg():
                total += len(tf.extractfile(member).read())
    return total


def fresh_process_load(data: Path, cache: Path) -> tuple[float, float, float]:
    """Wall and CPU seconds from launching a new interpreter to a loaded (cached)
    dataset, and the wall seconds of it spent importing hasten.data (and torch)."""
    env = {**os.environ, "HASTEN_CACHE": str(cache), "HASTEN_PROGRESS": "0"}
    start, cpu = time.perf_counter(), own_cpu_s()
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(data)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return time.perf_counter() - start, own_cpu_s() - cpu, float(out.split()[0])


def timing_row(xs: list[float], cpu: list[float]) -> dict:
    """One variant's row: its wall seconds (std None for one load) and mean CPU seconds."""
    return {"n": len(xs), "mean_s": mean(xs), "std_s": sample_std(xs), "min_s": min(xs), "runs_s": xs,
            "cpu_mean_s": mean(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser, "CIFAR-10-JPEG archive")
    parser.add_argument("--first", type=int, default=3, help="first (uncached) loads per variant")
    parser.add_argument("--cached", type=int, default=5, help="cached loads per variant")
    args = parser.parse_args()
    require_data(args.data, "data_load")
    args.data = Path(args.data).resolve()
    os.environ.setdefault("HASTEN_PROGRESS", "0")

    rows: dict[str, list[float]] = {"read archive: tarfile alone": [], "read archive: iter_files": [],
                                    "first load, workers=all cores": [], "first load, workers=1": [],
                                    "cached, same process": [], "cached, fresh process": [],
                                    "  of which import torch+hasten": []}
    cpu: dict[str, list[float]] = {label: [] for label in rows}
    first_variants = ["read archive: tarfile alone", "read archive: iter_files",
                      "first load, workers=all cores", "first load, workers=1"]
    scratch = Path(tempfile.mkdtemp(prefix="hasten-bench-"))
    order = []
    try:
        with MeasuredConditions("cpu") as cond:
            for i, label in interleaved(first_variants, args.first, seed=0):
                order.append([i, label])
                if label.startswith("read archive"):
                    read = read_with_tarfile if "tarfile" in label else (
                        lambda p: sum(len(data) for _, data in iter_files(p)))
                    start, cpu_start = time.perf_counter(), own_cpu_s()
                    read(args.data)
                    rows[label].append(time.perf_counter() - start)
                    cpu[label].append(own_cpu_s() - cpu_start)
                    continue
                workers = 1 if label.endswith("workers=1") else None
                cache = scratch / f"{i}-{workers}"
                seconds, cpu_s, ds = timed_load(args.data, cache, workers=workers)
                assert not ds.cached
                rows[label].append(seconds)
                cpu[label].append(cpu_s)
                shutil.rmtree(cache)
            cache = scratch / "warm"
            timed_load(args.data, cache)
            for i, label in interleaved(["cached, same process", "cached, fresh process"], args.cached, seed=1):
                order.append([i, label])
                if label == "cached, same process":
                    seconds, cpu_s, ds = timed_load(args.data, cache)
                    assert ds.cached
                    rows[label].append(seconds)
                    cpu[label].append(cpu_s)
                else:
                    total, cpu_s, imports = fresh_process_load(args.data, cache)
                    rows[label].append(total)
                    cpu[label].append(cpu_s)
                    rows["  of which import torch+hasten"].append(imports)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    conditions = cond.as_dict()
    env = conditions["environment"]
    result = {
        "benchmark": "data_load",
        "data": os.path.relpath(args.data),  # no local install path in results
        "dataset": ds.summary(),
        "hardware": hardware_label(env),
        "conditions": conditions,
        "cached_loads_read": "the OS page cache (the entry was just written)",
        "order": order,
        "results": {label: timing_row(xs, cpu[label]) for label, xs in rows.items()},
    }
    first = result["results"]["first load, workers=all cores"]["mean_s"]
    result["speedup_cached_vs_first"] = first / result["results"]["cached, same process"]["mean_s"]

    print(f"{ds.summary()}\n{hardware_label(env)}, torch {torch.__version__}")
    print(f"{'load':<32}{'n':>3}{'mean s':>9}{'std s':>8}{'min s':>8}{'CPU s':>8}")
    for label, s in result["results"].items():
        cpu_s = f"{s['cpu_mean_s']:>8.3f}" if s["cpu_mean_s"] is not None else f"{'':>8}"
        std = f"{s['std_s']:>8.3f}" if s["std_s"] is not None else f"{'-':>8}"
        print(f"{label:<32}{s['n']:>3}{s['mean_s']:>9.3f}{std}{s['min_s']:>8.3f}{cpu_s}")
    print(f"cached load is {result['speedup_cached_vs_first']:.0f}x faster than the first load")
    print(cond.summary())

    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "data_load.json", result)
    plot(result, RESULTS / "data_load.png")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [k for k in result["results"] if not k.startswith(" ")]
    means = [result["results"][k]["mean_s"] for k in labels]
    stds = [result["results"][k]["std_s"] or 0.0 for k in labels]  # None: one load, no error bar
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh(labels, means, xerr=stds, color=["#bbb", "#888", "#c44", "#e99", "#4a4", "#8c8"][: len(labels)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (mean ± std)")
    ax.set_title(f"load_dataset(cifar10-jpeg.tar.xz), {result['hardware']}", fontsize=9)
    for y, (m, s) in enumerate(zip(means, stds)):
        ax.text(m + s, y, f"  {m:.2f} s", va="center", fontsize=8)
    ax.set_xlim(0, max(m + s for m, s in zip(means, stds)) * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
