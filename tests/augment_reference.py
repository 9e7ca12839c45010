"""Slow, explicit references for the augmentation tests: translations by index
arithmetic, cutout squares by a per-pixel loop. Written independently of
``hasten.data.device_augment`` and ``hasten.data.host_augment`` (no padding
functions, no gathers), so a test comparing against them checks the real thing.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def reflect(i: int, n: int) -> int:
    """Index into a row of ``n`` pixels of position ``i`` after reflect padding
    (the edge pixel is not repeated: -1 -> 1, n -> n - 2)."""
    return -i if i < 0 else 2 * (n - 1) - i if i >= n else i


@lru_cache(maxsize=None)
def shifted_indices(h: int, w: int, dy: int, dx: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the view that reads pixel (y + dy, x + dx) at (y, x),
    reflected at the borders: a crop of the reflect-padded image at offset (dy, dx)."""
    return (np.array([reflect(y + dy, h) for y in range(h)]), np.array([reflect(x + dx, w) for x in range(w)]))


def offsets(pad: int) -> list[tuple[int, int]]:
    """Every (dy, dx) in [-pad, pad]^2."""
    return [(dy, dx) for dy in range(-pad, pad + 1) for dx in range(-pad, pad + 1)]


@lru_cache(maxsize=None)
def cutout_mask(h: int, w: int, size: int, cy: int, cx: int) -> np.ndarray:
    """(h, w) bool: the size x size square with top-left (cy - size // 2, cx - size // 2),
    clipped at the borders (DeVries & Taylor's centring), pixel by pixel. Cached: read only."""
    mask = np.zeros((h, w), dtype=bool)
    for y in range(h):
        for x in range(w):
            mask[y, x] = cy - size // 2 <= y < cy - size // 2 + size and cx - size // 2 <= x < cx - size // 2 + size
    mask.flags.writeable = False
    return mask


def identify(output: np.ndarray, source: np.ndarray, pad: int, cutout: int = 0) -> tuple:
    """The one (dy, dx, mirrored, centre) for which ``output`` (C, H, W) is ``source``
    translated by (dy, dx) with reflect padding, mirrored if ``mirrored``, and cut out
    at ``centre`` (None without cutout). Fails unless exactly one view matches."""
    _, h, w = source.shape
    zero = (output == 0).all(0) if cutout else np.zeros((h, w), dtype=bool)
    centre = None
    if cutout:
        centres = [(cy, cx) for cy in range(h) for cx in range(w) if np.array_equal(cutout_mask(h, w, cutout, cy, cx), zero)]
        assert len(centres) == 1, f"the zeroed pixels are not one cutout square ({len(centres)} centres fit)"
        centre = centres[0]
    matches = []
    for dy, dx in offsets(pad):
        rows, cols = shifted_indices(h, w, dy, dx)
        view = source[:, rows[:, None], cols[None, :]]
        for mirrored in (False, True):
            v = view[:, :, ::-1] if mirrored else view
            if np.array_equal(v[:, ~zero], output[:, ~zero]):
                matches.append((dy, dx, mirrored, centre))
    assert len(matches) == 1, f"output matches {len(matches)} reference views"
    return matches[0]
