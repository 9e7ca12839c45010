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
- ``DALI CPU``: NVIDIA DALI's CPU-only pipeline (``benchmarks/pipeline_peers.py``;
  ``pip install nvidia-dali-cuda120``, a benchmark-only peer, skipped when absent);
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
"""

from __future__ import annotations

import argparse
import hashlib
import io
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hasten.cores import usable_cores
from hasten.cpu_time import descendants
from hasten.decode import backends
from hasten.progress import progress
from hasten.rundir import write_json
from hasten.stream.fused_crop import random_resized_box
from hasten.stream.pack import pack
from hasten.stream.shard_cache import ShardCache
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import ShardFiles, open_shards
from hasten.stream.slow_storage import SlowStorage
from hasten.timing import interleaved

sys.path.insert(0, str(Path(__file__).parent))
from _common import (RESULTS, MeasuredConditions, ProcessRng, hardware_label, mean_ci, memory_bytes,  # noqa: E402
                     paired_ratios, plus_minus)

from pipeline_peers import (WARMUP_BATCHES, dali_cpu_iter, dali_unavailable_reason, measure,  # noqa: E402
                            torchvision_sample, torchvision_unavailable_reason, torchvision_versions)

GOAL_SPEEDUP, GOAL_CACHE, GOAL_OVER_DALI = 2.5, 3.0, 2.0
FORMAT = 1  # bump when the generated images change


# ----------------------------------------------------------------------------
# The data set
# ----------------------------------------------------------------------------

def _texture(rng, side: int = 1024) -> np.ndarray:
    """Coarse + mid + fine texture, float32 (side, side, 3), centred on 0."""
    def upsampled(div, spread, mode):
        small = rng.normal(0, 1, (side // div + 2, side // div + 2, 3)).astype(np.float32)
        img = Image.fromarray(np.clip(small * spread + 128, 0, 255).astype(np.uint8)).resize((side, side), mode)
        return np.asarray(img, np.float32) - 128

    return upsampled(16, 60, Image.BICUBIC) * 0.8 + upsampled(4, 40, Image.BILINEAR) * 0.6 + \
        rng.normal(0, 14, (side, side, 3)).astype(np.float32)


def _size(rng) -> tuple[int, int]:
    u = rng.random()
    if u < 0.75:  # landscape, like most ImageNet photos
        w = int(rng.integers(400, 601))
        return int(round(w * rng.uniform(0.66, 0.8))), w
    if u < 0.95:
        h = int(rng.integers(400, 601))
        return h, int(round(h * rng.uniform(0.66, 0.8)))
    s = int(rng.integers(375, 501))
    return s, s


def _write_images(job) -> int:
    root, seed, items = job
    os.nice(10)
    rng = np.random.default_rng(seed)
    tex = _texture(rng)
    for path, label in items:
        h, w = _size(rng)
        y0, x0 = int(rng.integers(0, tex.shape[0] - h)), int(rng.integers(0, tex.shape[1] - w))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        # A class-dependent base colour, so that labels are learnable.
        base = 70 + 110 * np.array([(label * 37 % 100) / 100, (label * 61 % 100) / 100, (label * 83 % 100) / 100])
        tilt = rng.uniform(-0.15, 0.15, (2, 3)).astype(np.float32)
        img = base.astype(np.float32) + xx[..., None] * tilt[0] + yy[..., None] * tilt[1] + tex[y0:y0 + h, x0:x0 + w]
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        target = Path(root) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(buf.getvalue())
    return len(items)


def make_dataset(cache: Path, images: int, classes: int, test_per_class: int, seed: int, procs: int) -> tuple[Path, Path]:
    """(image folder, shard directory), generated and packed once per parameter set."""
    name = f"v{FORMAT}-{images}x{classes}-t{test_per_class}-s{seed}"
    root = cache / "imagenet-like" / name
    folder, shards = root / "folder", root / "shards"
    if (shards / "index.json").is_file():
        return folder, shards
    shutil.rmtree(root, ignore_errors=True)
    items = [(f"train/c{k % classes:03d}/{k:06d}.jpg", k % classes) for k in range(images)]
    items += [(f"test/c{c:03d}/t{c:03d}{j:02d}.jpg", c) for c in range(classes) for j in range(test_per_class)]
    jobs = [(str(folder), seed * 100_003 + i, items[i:i + 500]) for i in range(0, len(items), 500)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(procs) as pool, progress(total=len(items), desc="generating JPEGs", unit="img") as bar:
        for n in pool.map(_write_images, jobs):
            bar.update(n)
    print(f"generated {len(items)} JPEGs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    pack(folder, shards, shard_bytes=64 << 20, seed=seed)
    return folder, shards


def packed_folder(cache: Path, folder: Path, seed: int) -> tuple[Path, Path]:
    """(``folder``, its shards): a given image folder packed once, in a cache directory named
    for the folder's path and the names and sizes of its files."""
    if not (folder / "train").is_dir():
        raise SystemExit(f"--folder {folder}: expected train/<class>/ (and test/<class>/) folders of JPEGs")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    key = hashlib.sha256(str(folder.resolve()).encode() + b"".join(
        f"{p.relative_to(folder)}:{p.stat().st_size}\n".encode() for p in files)).hexdigest()[:12]
    shards = cache / "imagenet-like" / f"folder-{folder.name}-{key}" / "shards"
    if not (shards / "index.json").is_file():
        shutil.rmtree(shards, ignore_errors=True)
        pack(folder, shards, shard_bytes=64 << 20, seed=seed)
    return folder, shards


# ----------------------------------------------------------------------------
# The baseline: what a careful plain PyTorch user writes
# ----------------------------------------------------------------------------

class PillowRRC(torch.utils.data.Dataset):
    """Image files -> Pillow open, full decode, random-resized crop, flip, uint8 tensor."""

    def __init__(self, files: list[tuple[str, int]], size: int):
        self.files, self.size = files, size
        self.rng = ProcessRng()

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path, label = self.files[i]
        rng = self.rng()
        with Image.open(path) as img:
            img = img.convert("RGB")
        b = random_resized_box(img.height, img.width, rng)  # torchvision's RandomResizedCrop.get_params
        img = img.crop((b.left, b.top, b.left + b.width, b.top + b.height)).resize((self.size, self.size),
                                                                                  Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1), label


def image_files(folder: Path, split: str = "train") -> list[tuple[str, int]]:
    classes = sorted(p.name for p in (folder / split).iterdir())
    return [(str(f), c) for c, name in enumerate(classes) for f in sorted((folder / split / name).iterdir())]


# ----------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------

def decode_only(paths: list[str], decoder: str) -> tuple[float, float, int, float]:
    """Full-size decodes in this process: (images per wall second, per CPU-second, images, CPU ms per image)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for p in paths:
        data = Path(p).read_bytes()
        if decoder == "simplejpeg":
            backends.simplejpeg.decode_jpeg(data, colorspace="RGB")
        else:
            with Image.open(io.BytesIO(data)) as img:
                np.asarray(img.convert("RGB"))
    cpu = time.process_time() - cpu0
    return len(paths) / (time.perf_counter() - wall0), len(paths) / cpu, len(paths), cpu / len(paths) * 1e3


def stage_breakdown(shards: ShardFiles, size: int, images: int = 768, seed: int = 0) -> dict:
    """CPU ms per image of each stage of hasten's path, in one process (one torch thread):
    the loading process's part (scan the shard's tar headers, pack a chunk's records for
    a worker) and a decode worker's (unpack, read the image's bytes from the shard file,
    header and crop box, decode, resize into the batch, flip; batches reused as the loader
    reuses them once the consumer lets go). Measured by wrapping the
    functions the loader calls, so the split follows the code; "other" is the rest of
    ``decode_chunk``."""
    from hasten.decode import turbojpeg
    from hasten.stream import chunk_decode, shared_buffers, tar_members
    from hasten.stream import fused_crop as fc

    spent: dict[str, float] = {}

    def timed(label, fn):
        def wrapper(*a, **kw):
            t = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - t
        return wrapper

    originals = [(turbojpeg, "decode_region"), (fc, "resize_whole"), (fc, "_finish"), (backends, "decode_simplejpeg"),
                 (backends, "decode_pillow"), (tar_members, "read_member")]
    saved = [getattr(o, a) for o, a in originals]
    labels = ["decode (region, libturbojpeg)", "resize (into the batch)", "flip (in the batch)",
              "decode (simplejpeg/Pillow)", "decode (simplejpeg/Pillow)", "read the image's bytes (pread)"]
    records, i, t_scan = [], 0, 0.0
    while len(records) < images and i < len(shards):
        t = time.process_time()
        got = tar_members.scan_shard(shards.paths[i], shards.names[i])  # as the loader reads local shards
        t_scan += time.process_time() - t
        records += got
        i += 1
    parsed = len(records)
    records = records[:images]
    for k, r in enumerate(records):
        r.key = k
    chunks = [list(enumerate(records[j:j + 256], start=j)) for j in range(0, len(records), 256)]
    pool = shared_buffers.BufferPool()  # as the loader packs: records only, images stay in the shard file
    batches = shared_buffers.BatchPool((256, size, size, 3), cap=2)  # and decodes into reused batches
    t_pack = t_total = 0.0
    try:
        for (o, a), label in zip(originals, labels):
            setattr(o, a, timed(label, getattr(o, a)))
        for c in chunks:
            t = time.process_time()
            packed = chunk_decode.pack_chunk(c, pool, batches)
            t_pack += time.process_time() - t
            t = time.process_time()
            chunk_decode.decode_chunk(packed, image_size=size, seed=seed, epoch=0, crop="random-resized")
            t_total += time.process_time() - t
            pool.release_oldest()  # the chunk is decoded: its buffers serve the next one
            batches.arrived(0)
    finally:
        for (o, a), fn in zip(originals, saved):
            setattr(o, a, fn)
    n = len(records)
    floor = decode_floor(records, size, seed) if turbojpeg.available() else None
    per = {"loading process: scan the shard's tar headers": t_scan / parsed,
           "loading process: pack records for a worker": t_pack / n}
    per.update({f"worker: {k}": v / n for k, v in spent.items()})
    per["worker: other (unpack, header, crop box, generator, bookkeeping)"] = (t_total - sum(spent.values())) / n
    return {"images": n, "image_size": size, "ms_per_image": {k: round(v * 1e3, 4) for k, v in per.items()},
            "total_ms_per_image": round(sum(per.values()) * 1e3, 4),
            "decode_floor_ms_per_image": floor and round(floor * 1e3, 4),
            "decoder": "libturbojpeg partial decode" if turbojpeg.available() else
            ("simplejpeg" if backends.simplejpeg is not None else "pillow")}


def decode_floor(records, size: int, seed: int) -> float:
    """CPU seconds per image that any libjpeg-turbo decode of the crop spends, whatever its
    scale and resize: the entropy decoding of every row down to the box's last, all columns
    (a baseline JPEG's scan is one Huffman-coded stream, read in order: rows above the box
    are decoded to be skipped, columns beside it to reach the next row), with the per-image
    set-up (header, tables). Measured as the decode of the box's last row alone at 1/8 scale
    (an IDCT of the DC coefficient only), for the boxes ``decode_chunk`` draws."""
    from hasten.decode import turbojpeg
    from hasten.decode.header import read_header
    from hasten.stream.fused_crop import ExampleRngs, random_resized_box
    from hasten.stream.tar_members import with_bytes

    rngs, jobs = ExampleRngs(), []
    for r in records:
        data = with_bytes(r).data
        header = read_header(data, r.name)
        box = random_resized_box(header.height, header.width, rngs(seed, 0, r.key))
        last = min(turbojpeg.scaled(header.height, 1, 8) - 1, (box.top + box.height - 1) // 8)
        jobs.append((data, last))
    t = time.process_time()
    for data, last in jobs:
        turbojpeg.decode_region(data, (last, 0, 1, 1), (1, 8))
    return (time.process_time() - t) / max(1, len(jobs))


def _memory_mb(pid: int) -> tuple[float, float]:
    """(RSS of pid, PSS of pid and its descendants: the decode workers), MB."""
    return memory_bytes([pid])[1] / 2**20, memory_bytes([pid, *descendants(pid)])[0] / 2**20


def rss_over_epochs(shards: ShardFiles, workers: int, epochs: int, size: int) -> list[dict]:
    """Peak and mean memory per epoch while streaming whole epochs with ``ShardLoader``."""
    loader = ShardLoader(shards, batch_size=256, image_size=size, workers=workers, seed=1)
    out = []
    for epoch in range(epochs):
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(_memory_mb(os.getpid()))
                stop.wait(0.25)

        thread = threading.Thread(target=sample, daemon=True)
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        thread.start()
        n = 0
        for x, _ in progress(loader, desc=f"memory, epoch {epoch + 1}", unit="batch"):
            n += len(x)
        stop.set()
        thread.join()
        rss, pss = np.array([s[0] for s in samples]), np.array([s[1] for s in samples])
        out.append({"epoch": epoch + 1, "images": n, "wall_s": round(time.perf_counter() - t0, 2),
                    "rss_mb_peak": round(float(rss.max()), 1), "rss_mb_mean": round(float(rss.mean()), 1),
                    "pss_mb_with_workers_peak": round(float(pss.max()), 1), "samples": len(samples)})
    return out


def _child(results, fn, args) -> None:
    results.put(fn(*args))


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new interpreter (spawn): its resident memory is a training
    process's (torch, hasten), not this one's, which has loaded every peer (DALI, OpenCV)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child, args=(results, fn, args))  # not daemonic: it starts workers
    child.start()
    try:
        return results.get()
    finally:
        child.join()


def cache_epochs(shards: ShardFiles, n_shards: int, workers: int, size: int, latency_s: float,
                 bandwidth: float) -> dict:
    """Wall time of two epochs over the first ``n_shards`` shards behind SlowStorage + ShardCache."""
    subset = ShardFiles(shards.paths[:n_shards], shards.names[:n_shards], shards.examples[:n_shards],
                        shards.sizes[:n_shards], shards.classes)
    with tempfile.TemporaryDirectory(prefix="hasten-shard-cache-") as tmp:
        slow = SlowStorage(subset, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth)
        cache = ShardCache(slow, tmp, max_bytes=sum(subset.sizes) + 1)
        loader = ShardLoader(cache, batch_size=256, image_size=size, workers=workers, seed=2)
        times = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            t0 = time.perf_counter()
            n = sum(len(x) for x, _ in loader)
            times.append(time.perf_counter() - t0)
        return {"shards": n_shards, "images_per_epoch": n, "bytes": sum(subset.sizes),
                "slow_storage": {"latency_s": latency_s, "bandwidth_bytes_per_s": bandwidth},
                "epoch_s": [round(t, 2) for t in times], "slow_reads": slow.reads, "cache_hits": cache.hits,
                "cache_epoch2_speedup": times[0] / times[1]}


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict:
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
    torch.set_num_threads(1)
    cache = Path(args.cache_dir or os.environ.get("HASTEN_CACHE") or Path.home() / ".cache" / "hasten").expanduser()
    out_path = Path(args.out) if args.out else (cache / "imagenet_pipeline_smoke.json" if args.smoke
                                                 else RESULTS / "imagenet_pipeline.json")
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
    files = image_files(folder)
    sizes = [int(s) for s in args.image_sizes.split(",")]
    k = args.workers

    def hasten_iter(size, seed):
        return lambda: iter(ShardLoader(shards, batch_size=256, image_size=size, workers=k, seed=seed))

    def baseline_iter(size, seed):
        def make():
            return iter(torch.utils.data.DataLoader(PillowRRC(files, size), batch_size=256, shuffle=True,
                                                    num_workers=k, generator=torch.Generator().manual_seed(seed)))
        return make

    dali_reason = dali_unavailable_reason()
    if dali_reason:
        print(f"DALI CPU peer skipped: {dali_reason}", file=sys.stderr)

    def dali_iter(size, seed):
        return dali_cpu_iter(files, size, 256, threads=k, seed=seed)

    tv_reason = torchvision_unavailable_reason(args.torchvision_python)
    if tv_reason:
        print(f"torchvision peer skipped: {tv_reason}", file=sys.stderr)
    else:
        files_json = cache / "imagenet-like" / f"files-{len(files)}.json"
        write_json(files_json, files)

    configs = []
    for size in sizes:
        configs += [(f"hasten fused {size}", "hasten", size), (f"torch DataLoader {size}", "baseline", size)]
        if not dali_reason:
            configs.append((f"DALI CPU {size}", "dali", size))
        if not tv_reason:
            configs.append((f"torchvision DataLoader {size}", "torchvision", size))
        if presized is not None:
            configs.append((f"hasten fused {size}, max side {args.max_side}", "presized", size))
    decoders = ["pillow"] + (["simplejpeg"] if backends.simplejpeg is not None else [])
    configs += [(f"decode only, {d}", d, None) for d in decoders]
    samples: dict[str, list] = {name: [] for name, *_ in configs}
    order = []
    rng = np.random.default_rng(args.seed)
    floor_paths = [files[i][0] for i in rng.choice(len(files), min(len(files), args.measure_images // 2),
                                                       replace=False)]
    with MeasuredConditions("cpu") as cond:
        for r, (name, kind, size) in progress(list(interleaved(configs, args.repeats, seed=args.seed)),
                                              desc="throughput", unit="run"):
            order.append(name)
            seed = args.seed * 1000 + r
            sample = (args.measure_images, size, args.warmup_batches)
            if kind == "hasten":
                samples[name].append(measure(hasten_iter(size, seed), *sample))
            elif kind == "baseline":
                samples[name].append(measure(baseline_iter(size, seed), *sample))
            elif kind == "presized":
                samples[name].append(measure(lambda: iter(ShardLoader(presized, batch_size=256, image_size=size,
                                                                      workers=k, seed=seed)), *sample))
            elif kind == "dali":
                samples[name].append(measure(dali_iter(size, seed), *sample))
            elif kind == "torchvision":
                samples[name].append(torchvision_sample(args.torchvision_python, files_json, size,
                                                        args.measure_images, args.warmup_batches, k, seed))
            else:
                samples[name].append(decode_only(floor_paths, kind))
        stages = {str(size): stage_breakdown(shards, size, min(768, shards.total), seed=args.seed) for size in sizes}
        memory = in_fresh_process(rss_over_epochs, shards, k, args.memory_epochs, sizes[0])
        cache_test = cache_epochs(shards, min(args.cache_shards, len(shards)), k, sizes[0], args.latency,
                                  args.bandwidth_mb * 1e6)

    rows = {}
    for name, kind, size in configs:
        rows[name] = {"pipeline": kind, "image_size": size, "workers": k if size else 0,
                      "images_per_s_per_core": mean_ci([s[1] for s in samples[name]]),
                      "images_per_s_wall": mean_ci([s[0] for s in samples[name]]),
                      "loading_process_ms_per_image": mean_ci([s[3] for s in samples[name]]),
                      "seconds_to_first_batch": mean_ci([s[4] for s in samples[name]]) if size else None,
                      "images_per_sample": samples[name][0][2]}
    def ratio(a: str, b: str) -> dict:
        """Mean over mean, and per repeat (the repeats ran in the same shuffled rounds)."""
        x, y = rows[a]["images_per_s_per_core"], rows[b]["images_per_s_per_core"]
        pairs = paired_ratios(x["values"], y["values"])
        return {"mean": x["mean"] / y["mean"], "per_repeat": [round(p, 2) for p in pairs]}

    speedup = {str(size): ratio(f"hasten fused {size}", f"torch DataLoader {size}") for size in sizes}
    over_dali = {str(size): ratio(f"hasten fused {size}", f"DALI CPU {size}") for size in sizes
                 if f"DALI CPU {size}" in rows}
    floor = ratio(f"hasten fused {sizes[0]}", "decode only, simplejpeg") if "decode only, simplejpeg" in rows else None
    data_mb = sum(shards.sizes) / 1e6
    peaks = [m["rss_mb_peak"] for m in memory]
    result = {
        "benchmark": "imagenet_pipeline",
        "hardware": hardware_label(cond.as_dict()["environment"]),
        "decoder": "simplejpeg" if backends.simplejpeg is not None else "pillow",
        "data": {"train_images": shards.total, "classes": len(shards.classes), "shards": len(shards),
                 "shard_mb": round(data_mb / len(shards), 1), "train_mb": round(data_mb, 1),
                 "mean_jpeg_kb": round(data_mb * 1e3 / shards.total, 1), "cache_dir_name": folder.parent.name},
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
            str(size): ratio(f"hasten fused {size}", f"torchvision DataLoader {size}") for size in sizes
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
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(out_path, result)

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
    for m in memory:
        print(f"epoch {m['epoch']}: {m['images']} images, RSS peak {m['rss_mb_peak']:.0f} MB (mean "
              f"{m['rss_mb_mean']:.0f}), with workers (PSS) {m['pss_mb_with_workers_peak']:.0f} MB; "
              f"train set {data_mb:.0f} MB")
    print(f"shard cache behind SlowStorage: epoch 1 {cache_test['epoch_s'][0]:.1f} s, epoch 2 "
          f"{cache_test['epoch_s'][1]:.1f} s: {cache_test['cache_epoch2_speedup']:.1f}x (goal {GOAL_CACHE}x)")
    print(cond.summary())
    print(f"wrote {out_path}")
    return result


if __name__ == "__main__":
    main()
