"""ImageNet-like input pipeline: hasten's shards + fused decode/crop against a plain torch DataLoader.

The benchmark makes its own data set (once, cached outside the repository in
``$HASTEN_CACHE/imagenet-like/`` or ``~/.cache/hasten/imagenet-like/``): 20,000
training JPEGs (plus 10 per class for a test split) in 100 classes, of varied
sizes around 500x375 (landscape, portrait and square), quality 90, about 90 KB
each: synthetic pixels (smooth gradients, coarse and fine texture, pixel noise)
so that the files have the structure and size of photographs. They are written
as an image folder and packed into 64 MiB tar shards with ``hasten data pack``'s
function.

Measured, at equal output (224x224 uint8 crops, the random-resized-crop
distribution, random flips, batches of 256, the same number of worker processes or
threads):

- ``hasten fused``: ``ShardLoader`` over the shards (partial decode of the crop box
  with libjpeg-turbo 3 where the ``turbojpeg`` wheel installs, OpenCV's bilinear
  resize; ``hasten.stream.fused_crop``);
- ``hasten fused, max side 256``: the same over a copy packed with ``hasten data pack
  --max-side 256`` (FFCV's ``max_resolution``: it changes the data, so it is never the
  headline against full-size files);
- ``torch DataLoader``: what a careful user writes: a map-style Dataset over the
  image files that opens each with Pillow, decodes it in full, draws the crop
  (torchvision's algorithm, one numpy generator per worker), crops and resizes
  (bilinear), flips and makes a uint8 tensor; ``DataLoader(shuffle=True,
  num_workers=k)``;
- ``DALI CPU``: NVIDIA DALI's CPU-only pipeline (``benchmarks/pipeline_peers.py``; a
  benchmark-only peer, skipped when absent: DALI 2.4 goes into a folder of its own with
  ``pip install --target DIR nvidia-dali-cuda120==2.4.0``, then ``pip install --target DIR
  optree astunparse gast nvtx makefun libcst nvidia-libnvcomp-cu12``, and the benchmark runs
  with ``PYTHONPATH=<checkout>:DIR``);
- ``decode only``: full-size decode of each file in one process, no crop (the
  floor under any pipeline that decodes whole images), with simplejpeg and Pillow.

Every batch is copied into a staging buffer by the consumer (as ``.to(device)``
reads it), whichever pipeline made it. Also: the CPU of each stage of hasten's path
(``stage_breakdown``), the loading process's own CPU per image, and the decode's floor
(``decode_floor``: the entropy decoding of the rows down to the crop box's last, which
any libjpeg-turbo decode of the crop spends, DALI's too) with the ratio over DALI it
bounds. ``--folder DIR`` measures an image folder of one's own (real photographs)
instead of the generated set.

Throughput is images per CPU-second (user + system time of the process and its
workers): images per second per busy core, which a shared machine distorts much
less than wall time (reported too). Configurations run in a freshly shuffled
order in every repeat (``hasten.timing.interleaved``). Then: resident memory of
``ShardLoader`` sampled over two full epochs in a fresh interpreter (the main
process's RSS and the proportional set size of the process with its workers), and the local shard
cache (``ShardCache``) behind ``SlowStorage`` (latency and bandwidth per request):
the wall time of epoch 1 (every shard from slow storage) against epoch 2 (from
the cache), over the first ``--cache-shards`` shards.

    python benchmarks/imagenet_pipeline.py [--images 20000] [--classes 100] [--workers 2] [--repeats 3]
        [--measure-images 4096] [--image-sizes 224,128] [--cache-shards 4] [--folder DIR] [--smoke]

Writes ``benchmarks/results/imagenet_pipeline.json`` (``--out``); ``--smoke``: a
tiny set and one repeat, written under the cache directory unless ``--out`` is given.

This file is the command; its parts beside it: ``_imagenet_pipeline_data.py`` (the data set),
``_imagenet_pipeline_baseline.py`` (the Pillow DataLoader and the decode-only floor),
``_imagenet_pipeline_stages.py`` (the stage breakdown and the decode's floor) and
``_imagenet_pipeline_epochs.py`` (memory over epochs, the cache behind slow storage).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hasten.cores import usable_cores
from hasten.decode import backends
from hasten.progress import progress
from hasten.rundir import write_json
from hasten.stream.pack import pack
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import ShardFiles, open_shards
from hasten.timing import interleaved

sys.path.insert(0, str(Path(__file__).parent))
from _common import RESULTS, MeasuredConditions, hardware_label, mean_ci, paired_ratios, plus_minus  # noqa: E402
from _imagenet_pipeline_baseline import PillowRRC, decode_only  # noqa: E402
from _imagenet_pipeline_data import image_files, make_dataset, packed_folder  # noqa: E402
from _imagenet_pipeline_epochs import cache_epochs, in_fresh_process, rss_over_epochs  # noqa: E402
from _imagenet_pipeline_stages import stage_breakdown  # noqa: E402

from pipeline_peers import (WARMUP_BATCHES, dali_cpu_iter, dali_unavailable_reason, measure,  # noqa: E402
                            torchvision_sample, torchvision_unavailable_reason, torchvision_versions)

GOAL_SPEEDUP, GOAL_CACHE, GOAL_OVER_DALI = 2.5, 3.0, 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--smoke`` replaces the sizes with tiny ones and one repeat."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=20_000, help="training JPEGs to generate")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--test-per-class", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2, help="decode processes, for both pipelines")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--measure-images", type=int, default=4096,
                    help="images per throughput sample, after --warmup-batches")
    ap.add_argument("--warmup-batches", type=int, default=WARMUP_BATCHES,
                    help="batches before the clocks start (default %(default)s; 0: count the start-up too)")
    ap.add_argument("--image-sizes", default="224,128", help="output sizes; the goal is about 224")
    ap.add_argument("--memory-epochs", type=int, default=2)
    ap.add_argument("--cache-shards", type=int, default=4, help="shards in the slow-storage cache test")
    ap.add_argument("--latency", type=float, default=0.05, help="slow storage: seconds per request")
    ap.add_argument("--bandwidth-mb", type=float, default=2.0, help="slow storage: MB/s per request "
                    "(2 requests in flight: the default ShardLoader prefetch)")
    ap.add_argument("--cache-dir", default=None, help="where the data set is made (default $HASTEN_CACHE "
                    "or ~/.cache/hasten)")
    ap.add_argument("--folder", default=None, help="an image folder (train/<class>/*.jpg and test/<class>/) to "
                    "measure instead of the generated set, such as real photographs; packed once into the cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-side", type=int, default=256, help="also measure a copy packed with hasten data pack "
                    "--max-side (FFCV's max_resolution; 0: skip)")
    ap.add_argument("--torchvision-python", default=os.environ.get("HASTEN_TORCHVISION_PYTHON"),
                    help="a Python with torch and torchvision (its own venv) for the torchvision peer "
                         "(default $HASTEN_TORCHVISION_PYTHON; none: skipped)")
    ap.add_argument("--out", default=None, help=f"JSON path (default {RESULTS / 'imagenet_pipeline.json'})")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (checks that it runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.images, args.classes, args.test_per_class = 96, 4, 2
        args.repeats, args.measure_images, args.cache_shards, args.warmup_batches = 1, 40, 2, 0
        args.latency, args.bandwidth_mb, args.workers = 0.02, 50.0, min(args.workers, 1)
    return args


@dataclass(frozen=True)
class Data:
    """What the pipelines read: the image folder and its files (the Pillow DataLoader's, DALI's,
    torchvision's), its shards (hasten's) and the copy packed with ``--max-side`` (None: not measured)."""

    folder: Path
    files: list[tuple[str, int]]
    shards: ShardFiles
    presized: ShardFiles | None


def prepare_data(args: argparse.Namespace, cache: Path) -> Data:
    """The data set, made or packed once into ``cache``: the generated set or ``--folder``'s, its shards
    (several small ones under ``--smoke``) and the ``--max-side`` copy."""
    if args.folder:
        folder, shard_dir = packed_folder(cache, Path(args.folder).expanduser(), args.seed)
    else:
        folder, shard_dir = make_dataset(cache, args.images, args.classes, args.test_per_class, args.seed,
                                         procs=min(2, usable_cores()))
    if args.smoke:  # several small shards, so that the cache test has some to read
        small = shard_dir.parent / "smoke-shards"
        if not (small / "index.json").is_file():
            shutil.rmtree(small, ignore_errors=True)
            pack(folder, small, shard_bytes=400_000, seed=args.seed)
        shard_dir = small
    shards = open_shards(shard_dir, "train")
    presized = None
    if args.max_side:  # FFCV-style pre-sized store: measured, never the headline against full-size files
        presized_dir = shard_dir.parent / f"shards-max{args.max_side}"
        if not (presized_dir / "index.json").is_file():
            shutil.rmtree(presized_dir, ignore_errors=True)
            print(f"packing a copy with --max-side {args.max_side} (once)", file=sys.stderr)
            pack(folder, presized_dir, shard_bytes=64 << 20 if not args.smoke else 400_000, seed=args.seed,
                 max_side=args.max_side)
        presized = open_shards(presized_dir, "train")
    return Data(folder, image_files(folder), shards, presized)


def configurations(sizes: list[int], max_side: int, presized: ShardFiles | None, dali_reason: str | None,
                   tv_reason: str | None) -> list[tuple[str, str, int | None]]:
    """``(name, kind, image size)`` of every pipeline measured: the peers that are available, then the
    decode-only floors (no size)."""
    configs = []
    for size in sizes:
        configs += [(f"hasten fused {size}", "hasten", size), (f"torch DataLoader {size}", "baseline", size)]
        if not dali_reason:
            configs.append((f"DALI CPU {size}", "dali", size))
        if not tv_reason:
            configs.append((f"torchvision DataLoader {size}", "torchvision", size))
        if presized is not None:
            configs.append((f"hasten fused {size}, max side {max_side}", "presized", size))
    decoders = ["pillow"] + (["simplejpeg"] if backends.simplejpeg is not None else [])
    configs += [(f"decode only, {d}", d, None) for d in decoders]
    return configs


def throughput(args: argparse.Namespace, data: Data, kind: str, size: int | None, seed: int,
               files_json: Path | None, floor_paths: list[str]) -> tuple:
    """One sample of one pipeline (``pipeline_peers.measure``'s tuple; ``decode_only``'s for a floor)."""
    k, files = args.workers, data.files
    sample = (args.measure_images, size, args.warmup_batches)
    if kind == "hasten":
        return measure(lambda: iter(ShardLoader(data.shards, batch_size=256, image_size=size, workers=k,
                                                seed=seed)), *sample)
    if kind == "baseline":
        def make():
            return iter(torch.utils.data.DataLoader(PillowRRC(files, size), batch_size=256, shuffle=True,
                                                    num_workers=k, generator=torch.Generator().manual_seed(seed)))
        return measure(make, *sample)
    if kind == "presized":
        return measure(lambda: iter(ShardLoader(data.presized, batch_size=256, image_size=size,
                                                workers=k, seed=seed)), *sample)
    if kind == "dali":
        return measure(dali_cpu_iter(files, size, 256, threads=k, seed=seed), *sample)
    if kind == "torchvision":
        return torchvision_sample(args.torchvision_python, files_json, size, args.measure_images,
                                  args.warmup_batches, k, seed)
    return decode_only(floor_paths, kind)


def pipeline_rows(configs: list[tuple[str, str, int | None]], samples: dict[str, list], k: int) -> dict:
    """Each pipeline's figures over its repeats: mean and interval per CPU-second, per wall second, of the
    loading process alone, and to the first batch."""
    rows = {}
    for name, kind, size in configs:
        rows[name] = {"pipeline": kind, "image_size": size, "workers": k if size else 0,
                      "images_per_s_per_core": mean_ci([s[1] for s in samples[name]]),
                      "images_per_s_wall": mean_ci([s[0] for s in samples[name]]),
                      "loading_process_ms_per_image": mean_ci([s[3] for s in samples[name]]),
                      "seconds_to_first_batch": mean_ci([s[4] for s in samples[name]]) if size else None,
                      "images_per_sample": samples[name][0][2]}
    return rows


def ratio(rows: dict, a: str, b: str) -> dict:
    """Mean over mean, and per repeat (the repeats ran in the same shuffled rounds)."""
    x, y = rows[a]["images_per_s_per_core"], rows[b]["images_per_s_per_core"]
    pairs = paired_ratios(x["values"], y["values"])
    return {"mean": x["mean"] / y["mean"], "per_repeat": [round(p, 2) for p in pairs]}


def results(args: argparse.Namespace, data: Data, rows: dict, order: list[str], stages: dict, memory: list,
            cache_test: dict, dali_reason: str | None, tv_reason: str | None, cond: MeasuredConditions) -> dict:
    """The results file: the pipelines' rows, their ratios, the stages, memory and cache, against the goals."""
    sizes = [int(s) for s in args.image_sizes.split(",")]
    k, shards = args.workers, data.shards
    speedup = {str(size): ratio(rows, f"hasten fused {size}", f"torch DataLoader {size}") for size in sizes}
    over_dali = {str(size): ratio(rows, f"hasten fused {size}", f"DALI CPU {size}") for size in sizes
                 if f"DALI CPU {size}" in rows}
    floor = (ratio(rows, f"hasten fused {sizes[0]}", "decode only, simplejpeg")
             if "decode only, simplejpeg" in rows else None)
    data_mb = sum(shards.sizes) / 1e6
    peaks = [m["rss_mb_peak"] for m in memory]
    return {
        "benchmark": "imagenet_pipeline",
        "hardware": hardware_label(cond.as_dict()["environment"]),
        "decoder": "simplejpeg" if backends.simplejpeg is not None else "pillow",
        "data": {"train_images": shards.total, "classes": len(shards.classes), "shards": len(shards),
                 "shard_mb": round(data_mb / len(shards), 1), "train_mb": round(data_mb, 1),
                 "mean_jpeg_kb": round(data_mb * 1e3 / shards.total, 1), "cache_dir_name": data.folder.parent.name},
        "workers": k, "batch_size": 256, "repeats": args.repeats, "run_order": order,
        "measured": {"images_per_sample": args.measure_images, "warmup_batches": args.warmup_batches,
                     "cpu": "user + system of the process's threads and its live worker processes, from /proc, "
                            "between the end of the warm-up and the last batch"},
        "pipelines": rows,
        "images_per_s_per_core": {name: row["images_per_s_per_core"]["mean"] for name, row in rows.items()},
        "speedup_per_core": speedup,
        "speedup_per_core_over_dali": over_dali,
        "dali": dali_reason or "measured",
        "torchvision": tv_reason or f"measured (torch, torchvision: {torchvision_versions(args.torchvision_python)})",
        "speedup_per_core_over_torchvision": {
            str(size): ratio(rows, f"hasten fused {size}", f"torchvision DataLoader {size}") for size in sizes
            if f"torchvision DataLoader {size}" in rows},
        "over_simplejpeg_full_decode": floor,
        "stages": stages,
        # What no cut after the entropy decode can pass: DALI's CPU ms per image over the floor's.
        "decode_floor_bound": {str(size): {"floor_ms": st["decode_floor_ms_per_image"],
                                           "dali_ms": 1e3 / rows[f"DALI CPU {size}"]["images_per_s_per_core"]["mean"],
                                           "max_over_dali": 1e3 / rows[f"DALI CPU {size}"]["images_per_s_per_core"]
                                           ["mean"] / st["decode_floor_ms_per_image"]}
                               for size, st in ((int(z), st) for z, st in stages.items())
                               if f"DALI CPU {size}" in rows and st["decode_floor_ms_per_image"]},
        "rss_mb": memory,
        "rss_flat": {"epoch2_over_epoch1_peak": peaks[-1] / peaks[0], "train_set_mb": round(data_mb, 1)},
        "cache": cache_test,
        "cache_epoch2_speedup": cache_test["cache_epoch2_speedup"],
        "goals": {**{f"speedup_per_core_{size}": {"goal": GOAL_SPEEDUP, "measured": r["mean"],
                                                  "met": bool(r["mean"] >= GOAL_SPEEDUP)} for size, r in speedup.items()},
                  **{f"over_dali_per_core_{size}": {"goal": GOAL_OVER_DALI, "measured": r["mean"],
                                                    "met": bool(r["mean"] >= GOAL_OVER_DALI)}
                     for size, r in over_dali.items()},
                  "at_least_simplejpeg_full_decode": {"goal": 1.0, "measured": floor and floor["mean"],
                                                      "met": bool(floor and floor["mean"] >= 1.0)},
                  "cache_epoch2_speedup": {"goal": GOAL_CACHE, "measured": cache_test["cache_epoch2_speedup"],
                                           "met": bool(cache_test["cache_epoch2_speedup"] >= GOAL_CACHE)}},
        "smoke": args.smoke,
        "conditions": cond.as_dict(),
    }


def print_report(result: dict, sizes: list[int], data_mb: float, cond: MeasuredConditions) -> None:
    """The table of pipelines and a line per ratio, stage, epoch and the cache, against the goals."""
    rows, speedup, over_dali = result["pipelines"], result["speedup_per_core"], result["speedup_per_core_over_dali"]
    floor, stages, cache_test = result["over_simplejpeg_full_decode"], result["stages"], result["cache"]
    print(f"\n{'pipeline':<28}{'images/s/core':>18}{'images/s wall':>18}")
    for name, row in rows.items():
        c, w = row["images_per_s_per_core"], row["images_per_s_wall"]
        print(f"{name:<28}{plus_minus(c['mean'], c['std'], '.0f'):>18}"
              f"{plus_minus(w['mean'], w['std'], '.0f'):>18}")
    for size, s in speedup.items():
        print(f"speedup per core over the Pillow DataLoader at {size}: {s['mean']:.2f}x (goal {GOAL_SPEEDUP}x); "
              f"per repeat {s['per_repeat']}")
    for size, s in result["speedup_per_core_over_torchvision"].items():
        print(f"over torchvision decode_jpeg + v2 in a DataLoader at {size}: {s['mean']:.2f}x; per repeat "
              f"{s['per_repeat']}")
    for size, s in over_dali.items():
        print(f"over DALI's CPU pipeline at {size}: {s['mean']:.2f}x (goal {GOAL_OVER_DALI}x); per repeat {s['per_repeat']}")
    if floor:
        print(f"hasten fused {sizes[0]} over simplejpeg's full decode alone: {floor['mean']:.2f}x (goal >= 1)")
    for size, st in stages.items():
        print(f"stages at {size} ({st['decoder']}), CPU ms per image: " +
              ", ".join(f"{k} {v:.3f}" for k, v in st["ms_per_image"].items()))
    for size, b in result["decode_floor_bound"].items():
        print(f"at {size}: the entropy decode down to the box's last row, {b['floor_ms']:.3f} ms per image, of "
              f"DALI's {b['dali_ms']:.3f}: at most {b['max_over_dali']:.2f}x DALI while every row above the box "
              "is decoded")
    for m in result["rss_mb"]:
        print(f"epoch {m['epoch']}: {m['images']} images, RSS peak {m['rss_mb_peak']:.0f} MB (mean "
              f"{m['rss_mb_mean']:.0f}), with workers (PSS) {m['pss_mb_with_workers_peak']:.0f} MB; "
              f"train set {data_mb:.0f} MB")
    print(f"shard cache behind SlowStorage: epoch 1 {cache_test['epoch_s'][0]:.1f} s, epoch 2 "
          f"{cache_test['epoch_s'][1]:.1f} s: {cache_test['cache_epoch2_speedup']:.1f}x (goal {GOAL_CACHE}x)")
    print(cond.summary())


def main(argv: list[str] | None = None) -> dict:
    """The data made or found, every pipeline measured in shuffled rounds, then the stages, memory and cache,
    all in one conditions block; the results written and printed."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    cache = Path(args.cache_dir or os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    out_path = Path(args.out) if args.out else (cache / "imagenet_pipeline_smoke.json" if args.smoke
                                                 else RESULTS / "imagenet_pipeline.json")
    data = prepare_data(args, cache)
    sizes = [int(s) for s in args.image_sizes.split(",")]
    k = args.workers
    dali_reason = dali_unavailable_reason()
    if dali_reason:
        print(f"DALI CPU peer skipped: {dali_reason}", file=sys.stderr)
    tv_reason = torchvision_unavailable_reason(args.torchvision_python)
    files_json = None
    if tv_reason:
        print(f"torchvision peer skipped: {tv_reason}", file=sys.stderr)
    else:
        files_json = cache / "imagenet-like" / f"files-{len(data.files)}.json"
        write_json(files_json, data.files)
    configs = configurations(sizes, args.max_side, data.presized, dali_reason, tv_reason)
    samples: dict[str, list] = {name: [] for name, *_ in configs}
    order = []
    rng = np.random.default_rng(args.seed)
    n_floor = min(len(data.files), args.measure_images // 2)
    floor_paths = [data.files[i][0] for i in rng.choice(len(data.files), n_floor, replace=False)]
    with MeasuredConditions("cpu") as cond:
        for r, (name, kind, size) in progress(list(interleaved(configs, args.repeats, seed=args.seed)),
                                              desc="throughput", unit="run"):
            order.append(name)
            samples[name].append(throughput(args, data, kind, size, args.seed * 1000 + r, files_json, floor_paths))
        shards = data.shards
        stages = {str(size): stage_breakdown(shards, size, min(768, shards.total), seed=args.seed) for size in sizes}
        memory = in_fresh_process(rss_over_epochs, shards, k, args.memory_epochs, sizes[0])
        cache_test = cache_epochs(shards, min(args.cache_shards, len(shards)), k, sizes[0], args.latency,
                                  args.bandwidth_mb * 1e6)
    rows = pipeline_rows(configs, samples, k)
    result = results(args, data, rows, order, stages, memory, cache_test, dali_reason, tv_reason, cond)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_path, result)
    print_report(result, sizes, sum(data.shards.sizes) / 1e6, cond)
    print(f"wrote {out_path}")
    return result


if __name__ == "__main__":
    main()
