"""Streaming pipeline throughput: hasten's ShardLoader against a plain torch DataLoader.

Both read the same JPEG bytes (CIFAR-10-JPEG train split, from the record cache),
decode, random-crop (reflect pad 4) and flip every image, and deliver uint8
batches of 256. Baseline: ``DataLoader(num_workers=k)`` over a map-style Dataset
that decodes with Pillow and augments per image with one numpy generator per
process (what a careful plain PyTorch script does). hasten: ``ShardLoader(workers=k,
crop="pad-crop")`` over ``open_source(data)`` (the archive read once into the record
blob, cut into virtual shards; simplejpeg when installed, as it is by default; chunked
decode into reused shared batches, vectorised crop/flip; k = 0 decodes in a thread of
the main process). Since the one pipeline replaced ``StreamLoader`` (issue 33), the
numbers in docs/results/streaming.md before that are StreamLoader's.

Reported: images per second (wall) and images per CPU-second (user + system
time of the process and its workers: the per-core efficiency, which a busy
shared machine distorts much less than wall time). Configurations run in a
freshly shuffled order in every repeat (``hasten.timing.interleaved``); the
load average and matmul rate before and after are recorded
(``hasten.environment.MeasuredConditions``).

    python benchmarks/pipeline_throughput.py [--data PATH] [--images 10000] [--repeats 3] [--workers 0,1,2]
    python benchmarks/pipeline_throughput.py --smoke   # a functional check: few images, nothing written

``--data`` defaults to ``$HASTEN_DATA`` if set, else ``../shared/data/cifar10-jpeg.tar.xz``
beside the checkout (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
import torch
from PIL import Image

from hasten.cpu_time import own_cpu_s
from hasten.decode import backends
from hasten.stream.records import open_records
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.sources import open_source
from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import (RESULTS, MeasuredConditions, ProcessRng, add_data_argument, describe, hardware_label,
                     plus_minus, require_data)


class PillowDataset(torch.utils.data.Dataset):
    """The plain baseline: Pillow decode, numpy reflect-pad crop and flip, per image."""

    def __init__(self, records):
        self.records = records
        self.rng = ProcessRng()

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        _, data, label = self.records[i]
        rng = self.rng()
        image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        image = np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect")
        dy, dx = rng.integers(0, 9, size=2)
        image = image[dy : dy + 32, dx : dx + 32]
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1), label


def measure(make_iter, images: int) -> tuple[float, float]:
    """(images per wall second, images per CPU second) over ``images`` images."""
    wall0, cpu0 = time.perf_counter(), own_cpu_s()
    it = make_iter()
    n = 0
    for x, _ in it:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 32, 32)
        n += len(x)
        if n >= images:
            break
    wall = time.perf_counter() - wall0
    del it  # DataLoader workers are joined here; their CPU time is then counted
    if hasattr(make_iter, "close"):
        make_iter.close()
    time.sleep(0.3)
    return n / wall, n / max(own_cpu_s() - cpu0, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--seed", type=int, default=0, help="seeds the order of configurations and the loaders")
    ap.add_argument("--smoke", action="store_true", help="1,024 images, one repeat, workers 0,1; nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.images, args.repeats, args.workers = 1024, 1, "0,1"
    require_data(args.data, "pipeline_throughput")
    torch.set_num_threads(1)
    records = open_records(args.data, "train")
    store = open_source(args.data, "train")
    workers = [int(w) for w in args.workers.split(",")]

    def hasten_iter(k, seed):
        def make():
            return iter(ShardLoader(store, batch_size=256, image_size=32, crop="pad-crop", workers=k, seed=seed))
        return make

    def baseline_iter(k, seed):
        def make():
            dl = torch.utils.data.DataLoader(PillowDataset(records), batch_size=256, shuffle=True, num_workers=k,
                                             generator=torch.Generator().manual_seed(seed))
            return iter(dl)
        return make

    configs = [(f"hasten ShardLoader workers={k}", "hasten", k, hasten_iter) for k in workers]
    configs += [(f"torch DataLoader+Pillow num_workers={k}", "baseline", k, baseline_iter) for k in workers]
    samples = {name: [] for name, *_ in configs}
    order = []
    with MeasuredConditions("cpu") as cond:
        for rep, (name, _, k, factory) in interleaved(configs, args.repeats, args.seed):
            order.append([rep, name])
            samples[name].append(measure(factory(k, args.seed + rep), args.images))

    env = cond.as_dict()["environment"]
    rows = []
    for name, kind, k, _ in configs:
        wall = [s[0] for s in samples[name]]
        cpu = [s[1] for s in samples[name]]
        rows.append({"config": name, "pipeline": kind, "workers": k, "n": len(wall),
                     "images_per_s": describe(wall), "images_per_cpu_s": describe(cpu),
                     "samples": samples[name]})
    for row in rows:
        base = next(r for r in rows if r["pipeline"] == "baseline" and r["workers"] == row["workers"])
        row["speedup_wall"] = row["images_per_s"]["mean"] / base["images_per_s"]["mean"]
        row["speedup_per_cpu_s"] = row["images_per_cpu_s"]["mean"] / base["images_per_cpu_s"]["mean"]
    result = {
        "benchmark": "pipeline_throughput",
        "dataset": "CIFAR-10-JPEG train (32x32 JPEG q75), decode + random crop (pad 4) + flip, batches of 256",
        "hardware": hardware_label(env),
        "torch": torch.__version__,
        "conditions": cond.as_dict(),
        "decoder_hasten": f"simplejpeg {backends.simplejpeg.__version__}" if backends.simplejpeg else "Pillow",
        "images_per_run": args.images,
        "repeats": args.repeats,
        "seed": args.seed,
        "order": order,
        "rows": rows,
    }
    if not args.smoke:
        write_json(RESULTS / "pipeline_throughput.json", result)
        plot(rows, RESULTS / "pipeline_throughput.png", result)
    print(f"{hardware_label(env)}, torch {torch.__version__}, n={args.repeats} runs of {args.images} images, "
          f"hasten decoder: {result['decoder_hasten']}")
    print(cond.summary())
    print(f"{'config':42} {'img/s':>14} {'img/CPU-s':>14} {'vs base wall':>12} {'vs base CPU':>11}")
    for r in rows:
        wall, cpu = r["images_per_s"], r["images_per_cpu_s"]
        print(f"{r['config']:42} {plus_minus(wall['mean'], wall['std'], '.0f'):>14} "
              f"{plus_minus(cpu['mean'], cpu['std'], '.0f'):>14} "
              f"{r['speedup_wall']:>11.2f}x {r['speedup_per_cpu_s']:>10.2f}x")


def plot(rows, path, meta) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "images_per_s", "images / s (wall)"),
                           (axes[1], "images_per_cpu_s", "images / CPU-second")):
        for kind, offset in (("baseline", -0.2), ("hasten", 0.2)):
            rs = [r for r in rows if r["pipeline"] == kind]
            ax.bar([r["workers"] + offset for r in rs], [r[key]["mean"] for r in rs], width=0.4,
                   yerr=[r[key]["std"] or 0.0 for r in rs], capsize=3,  # None: one repeat
                   label="torch DataLoader + Pillow" if kind == "baseline" else "hasten ShardLoader")
        ax.set_xticks(sorted({r["workers"] for r in rows}))
        ax.set_xlabel("decode workers (0 = in the main process)")
        ax.set_ylabel(label)
        ax.legend()
    c = meta["conditions"]
    fig.suptitle(f"CIFAR-10-JPEG decode+augment, {meta['hardware']}, torch {meta['torch']}; "
                 f"load average {c['load_average_before'][0]:.1f}->{c['load_average_after'][0]:.1f}, "
                 f"n={meta['repeats']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
