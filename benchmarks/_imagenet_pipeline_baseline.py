"""The pipelines benchmarks/imagenet_pipeline.py measures hasten against that live in it: what a
careful plain PyTorch user writes (``PillowRRC`` in a ``DataLoader``), and the full-size decode
alone, the floor under any pipeline that decodes whole images."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hasten.decode import backends
from hasten.stream.fused_crop import random_resized_box

from _common import ProcessRng


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
