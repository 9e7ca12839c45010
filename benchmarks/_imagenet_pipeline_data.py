"""The data of benchmarks/imagenet_pipeline.py (and of jpeg_decoders.py and remote_shards.py, which
read the same set): ImageNet-like JPEGs of synthetic pixels (smooth gradients, coarse and fine
texture, pixel noise; sizes around 500x375, quality 90), written as an image folder and packed into
64 MiB tar shards once per parameter set; or an image folder of one's own, packed once; and the
(path, label) list of a folder's split."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from hasten.progress import progress
from hasten.stream.pack import pack

FORMAT = 1  # bump when the generated images change


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


def image_files(folder: Path, split: str = "train") -> list[tuple[str, int]]:
    classes = sorted(p.name for p in (folder / split).iterdir())
    return [(str(f), c) for c, name in enumerate(classes) for f in sorted((folder / split / name).iterdir())]
