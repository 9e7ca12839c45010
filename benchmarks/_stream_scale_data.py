"""The data of benchmarks/stream_scale.py: ``--images`` synthetic 32x32 JPEGs of varied content,
deterministic in the seed, packed once by hasten's own packer (``hasten.stream.pack``) into about
``--shards`` tar shards with their index."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np


def synthetic_jpeg(rng: np.random.Generator, label: int, classes: int, side: int = 32) -> bytes:
    """A varied small JPEG: a two-colour gradient at a random angle, a rectangle whose colour
    follows the class, noise of a random strength, a random quality."""
    from PIL import Image

    yy, xx = np.mgrid[0:side, 0:side] / (side - 1)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx + np.sin(angle) * yy)[..., None]
    a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    image = (1 - t) * a + t * b
    x0, y0 = rng.integers(0, side - 8, 2)
    w, h = rng.integers(6, side // 2, 2)
    hue = np.array([np.sin(2 * np.pi * (label / classes + k / 3)) for k in range(3)]) * 110 + 128
    image[y0:y0 + h, x0:x0 + w] = hue
    image += rng.normal(0, rng.uniform(0, 20), image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=int(rng.integers(60, 96)))
    return out.getvalue()


def member_bytes(n: int) -> int:
    """Bytes a file of ``n`` bytes takes in a tar: a header block and its data rounded up to blocks."""
    return 512 + -(-n // 512) * 512


def make_data(root: Path, images: int, classes: int, shards: int, seed: int) -> Path:
    """The packed directory (made once, kept under ``root``): ``images`` training JPEGs (and
    one test image per class: the packer wants both splits) in about ``shards`` shards."""
    from hasten.stream.pack import pack

    packed = root / f"synthetic-{images}-{classes}-{shards}-{seed}" / "shards"
    if (packed / "index.json").exists():
        return packed
    # The JPEGs only live until they are packed: in memory where there is a tmpfs (a disk mounted
    # with discard took 15 min to delete 100k small files).
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="stream-scale-images-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                   else root))
    shutil.rmtree(packed, ignore_errors=True)
    used = 0
    try:
        for split, count in (("train", images), ("test", classes)):
            for c in range(classes):
                (folder / split / f"c{c:03d}").mkdir(parents=True)
            for i in range(count):
                label = i % classes
                data = synthetic_jpeg(np.random.default_rng([seed, split == "test", i]), label, classes)
                (folder / split / f"c{label:03d}" / f"{i:07d}.jpg").write_bytes(data)
                if split == "train":
                    used += member_bytes(len(data)) + member_bytes(len(str(label)))
            print(f"made {count} {split} images", file=sys.stderr, flush=True)
        pack(folder, packed, shard_bytes=used // shards + 1024, seed=seed)  # +1024: the tar's end blocks
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return packed
