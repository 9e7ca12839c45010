"""Peer input pipelines for benchmarks/imagenet_pipeline.py: NVIDIA DALI's CPU-only pipeline.

``dali_cpu_iter(files, size, batch_size, threads, seed)`` returns what the other
pipelines of ``imagenet_pipeline.py`` return: a zero-argument callable that makes
an iterator over one epoch of ``(images, labels)`` batches, images a uint8 tensor
(N, 3, size, size), labels int64 (N,). The pipeline is DALI's, on the CPU alone
(``device_id=None``: no GPU, no CUDA driver needed; checked with DALI 2.4):

    readers.file (the image files, shuffled) -> decoders.image_random_crop (decodes only
    the crop's region; RandomResizedCrop's distribution: area 8%-100%, aspect 3/4-4/3,
    10 tries) -> resize to size x size (bilinear, antialiased) -> crop_mirror_normalize
    (random horizontal flip, HWC -> CHW, uint8)

with ``threads`` DALI worker threads in this process, so the process's CPU time
(what ``imagenet_pipeline.measure`` counts) includes all of DALI's work.

DALI is a benchmark peer, never a dependency of hasten: ``pip install
nvidia-dali-cuda120`` (a wheel of about 0.4 GB download, 0.8 GB installed).
``dali_available()`` says whether it is there without raising;
``dali_unavailable_reason()`` gives the one line to print when it is not.

Changes the training math: no (a peer pipeline, measured for comparison). Its
shuffle is DALI's reader shuffle (a buffer of ``initial_fill`` samples), not a full
permutation as hasten's and the DataLoader's are.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator

import numpy as np
import torch

DALI_PIP = "nvidia-dali-cuda120"
_reason: str | None | bool = False  # False: not checked yet


def dali_unavailable_reason() -> str | None:
    """None when DALI imports, else one line saying why it cannot be used."""
    global _reason
    if _reason is False:
        try:
            found = importlib.util.find_spec("nvidia.dali") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            _reason = f"DALI is not installed (pip install {DALI_PIP}; benchmark only, about 0.8 GB)"
        else:
            try:
                from nvidia.dali import fn, pipeline_def  # noqa: F401

                _reason = None
            except Exception as e:  # noqa: BLE001 - any import failure is the one-line reason
                _reason = f"DALI does not import: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return _reason


def dali_available() -> bool:
    return dali_unavailable_reason() is None


def dali_cpu_iter(files: list[tuple[str, int]], size: int, batch_size: int, threads: int,
                  seed: int) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """A zero-arg callable making an iterator over one epoch of (uint8 (N, 3, size, size), int64 (N,)) batches
    from DALI's CPU-only pipeline over ``files`` = [(path, label), ...]."""
    reason = dali_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    if not files:
        raise ValueError("dali_cpu_iter: no files")
    if size < 1 or batch_size < 1 or threads < 1:
        raise ValueError(f"dali_cpu_iter: size, batch_size and threads must be >= 1, got {size}, {batch_size}, "
                         f"{threads}")
    from nvidia.dali import fn, pipeline_def, types

    paths = [str(p) for p, _ in files]
    labels = [int(c) for _, c in files]

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=seed)
    def pipe():
        jpegs, label = fn.readers.file(files=paths, labels=labels, random_shuffle=True, pad_last_batch=True,
                                       name="reader")
        img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
        img = fn.resize(img, resize_x=size, resize_y=size, antialias=True, interp_type=types.INTERP_LINEAR)
        img = fn.crop_mirror_normalize(img, dtype=types.UINT8, output_layout="CHW",
                                       mirror=fn.random.coin_flip(probability=0.5))
        return img, label

    def make() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        p = pipe()
        p.build()
        try:
            left = len(paths)  # the last batch is padded by the reader: keep only the epoch's own samples
            while left > 0:
                images, label = p.run()
                n = min(batch_size, left)
                left -= n
                x = torch.from_numpy(np.array(images.as_tensor())[:n])
                y = torch.from_numpy(np.array(label.as_tensor()).reshape(-1)[:n].astype(np.int64))
                yield x, y
        finally:
            del p  # stops DALI's threads before the caller reads the CPU clock

    return make
