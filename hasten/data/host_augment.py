"""Per-example random crop and flip on the host, vectorised over a chunk (numpy).

Augmentation where the data is when it is prepared on the host: in the
streaming pipeline's decode workers (``hasten.stream.chunk_decode``'s ``pad-crop``)
or after its echo stage (``hasten.stream.echo_stage``), and per batch in ``hasten.data.host_loader``. Each
example gets its own random shift and flip, but the work is one pad for the
whole chunk and one slice copy per image. The device-resident path has its
batched torch equivalent in ``hasten.data.device_augment``.

Based on: the standard CIFAR-10 augmentation (pad 4 with reflection, random
32x32 crop, horizontal flip), as in He et al. 2016 and the airbench recipe.

Changes the training math: yes, as any augmentation does (it is the usual one).
"""

from __future__ import annotations

import numpy as np


def crop_flip(images: np.ndarray, rng: np.random.Generator, *, pad: int = 4, flip: bool = True) -> np.ndarray:
    """Random crops (reflect-padded by ``pad``) and horizontal flips of (N, H, W, C) uint8 images."""
    n = _check(images, pad)
    span = 2 * pad + 1
    flipped = rng.random(n) < 0.5 if flip else np.zeros(n, dtype=bool)
    return apply_crop_flip(images, rng.integers(0, span, size=n), rng.integers(0, span, size=n), flipped, pad)


def keyed_crop_flip(
    images: np.ndarray, keys: np.ndarray, *, seed: int, copies: np.ndarray | None = None, pad: int = 4,
    flip: bool = True,
) -> np.ndarray:
    """``crop_flip`` with each example's shift and flip a hash of (seed, key, copy).

    ``keys`` identify the examples (dataset indices), ``copies`` number the echoed
    copies of one example (0 for the first). The same example gets the same
    augmentation in whatever chunk, batch or process it is augmented, so moving
    the augmentation (as example-before echoing does) changes nothing but the
    extra copies.
    """
    n = _check(images, pad)
    # The seed is mixed before the key joins: with seed ^ key, epoch e (seed e) would
    # reuse epoch 0's augmentations, handed to example key ^ e instead of key.
    h = _mix(_mix(np.full(n, seed & _MASK, dtype=np.uint64)) ^ np.asarray(keys, dtype=np.uint64))
    h = _mix(h ^ (np.asarray(copies, dtype=np.uint64) if copies is not None else np.uint64(0)))
    span = np.uint64(2 * pad + 1)
    dy = (h % span).astype(np.int64)
    dx = ((h >> np.uint64(16)) % span).astype(np.int64)
    flipped = ((h >> np.uint64(32)) & np.uint64(1)).astype(bool) if flip else np.zeros(n, dtype=bool)
    return apply_crop_flip(images, dy, dx, flipped, pad)


def apply_crop_flip(images: np.ndarray, dy, dx, flipped, pad: int) -> np.ndarray:
    """Crop image i of the reflect-padded batch at (dy[i], dx[i]) and flip it where ``flipped[i]``."""
    n, h, w, _ = images.shape
    if n == 0:
        return images
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect") if pad else images
    dy, dx, flipped = np.asarray(dy).tolist(), np.asarray(dx).tolist(), np.asarray(flipped).tolist()
    out = np.empty_like(images)
    # One strided slice copy per image beats a fancy-index gather (measured 10x on 32x32).
    for i in range(n):
        window = padded[i, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = window[:, ::-1] if flipped[i] else window
    return out


_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _check(images: np.ndarray, pad: int) -> int:
    if images.ndim != 4:
        raise ValueError(f"crop_flip expects (N, H, W, C) images; got shape {images.shape}")
    if pad < 0:
        raise ValueError(f"crop_flip pad must be >= 0; got {pad}")
    return images.shape[0]
