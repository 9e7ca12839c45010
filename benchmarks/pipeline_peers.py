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
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from hasten.cpu_time import tree_cpu_s

DALI_PIP = "nvidia-dali-cuda120"
WARMUP_BATCHES = 4  # batches before the clocks start: two per worker, as the loaders queue them
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


# ----------------------------------------------------------------------------
# Measurement (shared by every pipeline, in this interpreter or another)
# ----------------------------------------------------------------------------

def measure(make_iter, images: int, size: int, warmup: int = WARMUP_BATCHES) -> tuple[float, float, int, float, float]:
    """(images per wall second, images per CPU-second, images, CPU ms per image of this
    process alone, seconds to the first batch) in steady state: the clocks start after
    ``warmup`` batches (workers started, read-ahead and shuffle buffer filled, queues
    full) and stop at a batch boundary ``images`` later. The work in flight (batches
    decoded ahead, whatever the pipeline) is then about the same at both ends, so the
    CPU between them is what those images cost; counted from the start instead, a short
    sample charges every pipeline for its start-up and for the batches it decoded ahead
    and never delivered. Every batch is copied into a staging buffer (in its own memory
    format), as
    ``.to(device)`` would read it: a loader whose batches arrive in shared memory is
    charged for touching them, whichever process pays for that."""
    start = time.perf_counter()
    it = make_iter()
    n, staging, batches, first = 0, None, 0, None
    wall0 = cpu0 = t0 = None
    if warmup == 0:  # (the smoke test's one-batch epochs) from the start, start-up included
        wall0, cpu0, t0 = time.perf_counter(), tree_cpu_s(), os.times()
    for x, _ in it:
        assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, size, size)
        if staging is None or staging.shape != x.shape or staging.stride() != x.stride():
            # In the batch's own memory format, as .to(device) keeps it (channels_last stays
            # channels_last): a copy, not a transpose.
            staging = torch.empty_like(x)
        staging.copy_(x)
        batches += 1
        if first is None:
            first = time.perf_counter() - start
        if warmup and batches == warmup:
            wall0, cpu0, t0 = time.perf_counter(), tree_cpu_s(), os.times()
        elif batches > warmup:
            n += len(x)
            if n >= images:
                break
    if wall0 is None or n < images:
        # An epoch that ends inside the window has joined its workers: their CPU would be
        # missing from the end reading.
        raise RuntimeError(f"the pipeline gave {batches} batches: too few for {warmup} of warm-up and {images} "
                           "images to measure")
    wall, cpu, t1 = time.perf_counter() - wall0, tree_cpu_s() - cpu0, os.times()
    if hasattr(it, "close"):
        it.close()
    del it
    time.sleep(0.3)
    own = (t1.user - t0.user) + (t1.system - t0.system)
    return n / wall, n / max(cpu, 1e-9), n, own / n * 1e3, first



# ----------------------------------------------------------------------------
# torchvision: decode_jpeg + transforms.v2 in a DataLoader, in its own interpreter
# ----------------------------------------------------------------------------

class TorchvisionRRC(torch.utils.data.Dataset):
    """What the torchvision documentation suggests for fast JPEG loading: the file's bytes
    (``read_file``), ``decode_jpeg`` (libjpeg-turbo, full image, CHW uint8), then
    ``transforms.v2`` ``RandomResizedCrop(size)`` (bilinear, antialiased: v2's default)
    and ``RandomHorizontalFlip``."""

    def __init__(self, files: list[tuple[str, int]], size: int):
        from torchvision.transforms import v2

        self.files = files
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        path, label = self.files[i]
        return self.transform(decode_jpeg(read_file(path), mode=ImageReadMode.RGB)), label


def torchvision_iter(files: list[tuple[str, int]], size: int, batch_size: int, workers: int,
                     seed: int) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """As ``dali_cpu_iter``: one epoch of the torchvision pipeline in a DataLoader."""
    def make():
        return iter(torch.utils.data.DataLoader(TorchvisionRRC(files, size), batch_size=batch_size, shuffle=True,
                                                num_workers=workers,
                                                generator=torch.Generator().manual_seed(seed)))
    return make


def torchvision_unavailable_reason(python: str | None) -> str | None:
    """None when ``python`` imports torchvision with a working ``decode_jpeg``, else one line."""
    if not python:
        return ("no interpreter with torchvision given (--torchvision-python; torchvision on PyPI does not import "
                "beside torch 2.13.0+cpu: make a venv with pip install torch==2.14.1 torchvision==0.29.1)")
    probe = ("import torch, torchvision, torchvision.io as io; "
             "print(torch.__version__, torchvision.__version__)")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} does not run: {e}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"torchvision does not import in {python}: {last}"
    return None


def torchvision_versions(python: str) -> str:
    out = subprocess.run([python, "-c", "import torch, torchvision; print(torch.__version__, torchvision.__version__)"],
                         capture_output=True, text=True, timeout=300)
    return out.stdout.strip()


def torchvision_sample(python: str, files_json: str | os.PathLike, size: int, images: int, warmup: int,
                       workers: int, seed: int) -> tuple[float, float, int, float, float]:
    """One ``measure`` sample of the torchvision pipeline, taken in ``python`` (another
    interpreter: its torch and torchvision, and hasten from this checkout), through this
    file's ``peer_main``."""
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; import pipeline_peers; "
            "sys.exit(pipeline_peers.peer_main(sys.argv[1:]))")
    out = subprocess.run([python, "-c", code, "torchvision", str(files_json), str(size), str(images), str(warmup),
                          str(workers), str(seed)], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"torchvision peer failed: {out.stderr.strip()[-1500:]}")
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def peer_main(argv: list[str]) -> int:
    """``torchvision FILES_JSON SIZE IMAGES WARMUP WORKERS SEED``: print one sample as JSON."""
    kind, files_json, size, images, warmup, workers, seed = argv
    if kind != "torchvision":
        raise SystemExit(f"unknown peer {kind!r}")
    torch.set_num_threads(1)
    files = [tuple(f) for f in json.loads(Path(files_json).read_text())]
    size = int(size)
    print(json.dumps(measure(torchvision_iter(files, size, 256, int(workers), int(seed)), int(images), size,
                             int(warmup))))
    return 0
