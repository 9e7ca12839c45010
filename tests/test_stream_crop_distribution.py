"""The fused pipeline's crops follow torchvision's RandomResizedCrop, measured from its output pixels.

End to end through the real decode path: a JPEG whose red channel is the column (a
ramp 0..255 across the width) and whose green channel is the row is cropped by
``fused_crop`` for a few thousand example keys, and each crop's box is read back from
its pixels (a line fitted to the red values along the columns gives the left edge and
width, green along the rows the top edge and height; a falling red ramp is a flip).
The distributions of the recovered area fraction and log aspect ratio are compared
with samples of torchvision's own algorithm (copied below) by a two-sample
Kolmogorov-Smirnov statistic, and the flip count with a binomial bound.

Tolerance: on this image the recovered box differs from the one the pipeline drew by
1.0 to 1.4 px (sd) in each edge and side, at most 4.3 px (the box is rounded to whole
pixels of the DCT-scaled decode, up to factor / 2 px per edge), i.e. at most 2.3% in area
(sd 0.7%) and 0.027 in log aspect (sd 0.007): measured with ``_recover`` below on 1,000
keys per decoder, with either resize filter. That moves a KS statistic by well under
0.015, the allowance added to the 0.1% critical value.
"""

import functools
import io
import math

import numpy as np
import pytest
from PIL import Image

from hasten.stream import fused_crop as fc

WIDTH, HEIGHT = 500, 375  # an ImageNet-sized photo
SIZE = 64                 # output side: boxes of 128+ and 256+ px decode at 1/2 and 1/4
KEYS = 2000
REFERENCE = 30000
KS_C = 1.949              # c(alpha) of the two-sample KS test at alpha = 0.001
RECOVERY_ALLOWANCE = 0.015

# --- Reference: torchvision's algorithm --------------------------------------------------
# RandomResizedCrop.get_params, copied from pytorch/vision torchvision/transforms/transforms.py
# at commit 6247d96d3ce658d553e4e2ceea5cedd77f715b29 (the torchvision 0.8 line; later releases
# hoist log_ratio out of the loop and read the size with F.get_dimensions, the same draws).
# Only the random source differs: numpy's Generator for torch's global RNG, and the image size
# passed in instead of read from an image (torchvision is not a dependency of hasten).
def torchvision_get_params(height, width, scale, ratio, rng):
    area = height * width

    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        log_ratio = np.log(np.array(ratio))
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))

        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))

        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w

    # Fallback to central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


@functools.lru_cache(maxsize=None)  # the same reference for every decoder
def _reference(n, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=0):
    """(area fraction, log aspect) of n torchvision boxes on the test image."""
    rng = np.random.default_rng(seed)
    boxes = np.array([torchvision_get_params(HEIGHT, WIDTH, scale, ratio, rng) for _ in range(n)], float)
    h, w = boxes[:, 2], boxes[:, 3]
    return h * w / (HEIGHT * WIDTH), np.log(w / h)


def ks_statistic(a, b):
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, points, side="right") / len(a)
                               - np.searchsorted(b, points, side="right") / len(b))))


def ks_limit(n, m):
    """The statistic two samples of one distribution exceed with probability 0.001, plus the
    allowance for the recovered boxes' error (see the module docstring)."""
    return KS_C * math.sqrt((n + m) / (n * m)) + RECOVERY_ALLOWANCE


# --- The test image and reading a crop's box back from its pixels ------------------------
@pytest.fixture(scope="module")
def ramp_jpeg():
    """Red = column, green = row (each 0..255 across the image), blue constant; quality 95,
    4:4:4 so that chroma is not averaged over pixel pairs."""
    img = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    img[..., 0] = np.round(np.arange(WIDTH) * 255 / (WIDTH - 1))[None, :]
    img[..., 1] = np.round(np.arange(HEIGHT) * 255 / (HEIGHT - 1))[:, None]
    img[..., 2] = 128
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=95, subsampling=0)
    return buf.getvalue()


def _edges(profiles, full):
    """(start, length) in source pixels of the boxes whose resized ramps are ``profiles``
    (one per row).

    Output pixel j samples the source at start + (j + 0.5) * length / n - 0.5; the ramp
    maps source pixel x to 255 x / (full - 1). A line fitted to the inner pixels averages
    out JPEG noise and the ramp's steps; the outermost two are left out because a resize
    that cannot read past the box edge (a kernel run on the cropped array) biases them inwards."""
    n = profiles.shape[1]
    j = np.arange(2, n - 2, dtype=np.float64)
    inner = profiles[:, 2:n - 2]
    slope = (inner - inner.mean(axis=1, keepdims=True)) @ (j - j.mean()) / ((j - j.mean()) @ (j - j.mean()))
    intercept = inner.mean(axis=1) - slope * j.mean()
    per_level = (full - 1) / 255
    length = n * slope * per_level
    return intercept * per_level + 0.5 - 0.5 * length / n, length


def _recover(outs):
    """(left, top, width, height, flipped), each an array over the crops ``outs`` (N, S, S, 3)."""
    outs = outs.astype(np.float64)
    red, green = outs[..., 0].mean(axis=1), outs[..., 1].mean(axis=2)
    flipped = red[:, -1] < red[:, 0]
    red[flipped] = red[flipped, ::-1]
    left, width = _edges(red, WIDTH)
    top, height = _edges(green, HEIGHT)
    return left, top, width, height, flipped


def _crops(data, keys, seed=0):
    return _recover(np.stack([fc.fused_crop(data, "ramp.jpg", SIZE, rng=fc.example_rng(seed, 0, k))
                              for k in range(keys)]))


def test_crops_match_torchvision_random_resized_crop(ramp_jpeg, decoder, one_thread):
    left, top, w, h, flipped = _crops(ramp_jpeg, KEYS)
    # Every box lies inside the image, up to the recovery error.
    assert left.min() > -5 and top.min() > -5 and (left + w).max() < WIDTH + 5 and (top + h).max() < HEIGHT + 5
    scale, log_aspect = w * h / (WIDTH * HEIGHT), np.log(w / h)
    ref_scale, ref_log_aspect = _reference(REFERENCE)
    limit = ks_limit(KEYS, REFERENCE)
    assert ks_statistic(scale, ref_scale) < limit, "area fraction distribution differs from torchvision's"
    assert ks_statistic(log_aspect, ref_log_aspect) < limit, "aspect ratio distribution differs from torchvision's"
    # Flips: Binomial(KEYS, 1/2); 4 standard deviations (p ~ 6e-5 two-sided); a 45% rate is 4.5 away.
    assert abs(flipped.sum() - KEYS / 2) < 4 * math.sqrt(KEYS / 4)


@pytest.mark.parametrize("wrong", ["scale (0.2, 1)", "uniform aspect, no log", "ratio (0.5, 2)"])
def test_the_limits_reject_a_wrong_distribution(wrong):
    """The comparison above is sensitive: box distributions a bug could produce, at the same
    sample size and limit, are rejected (checked at the box level; through the decode path
    the same mutations give statistics of the same size)."""
    ref_scale, ref_log_aspect = _reference(REFERENCE)
    if wrong == "uniform aspect, no log":
        rng, rows = np.random.default_rng(1), []
        for _ in range(KEYS):  # torchvision's loop with the aspect drawn uniformly, not log-uniformly
            for _ in range(10):
                target, aspect = HEIGHT * WIDTH * rng.uniform(0.08, 1.0), rng.uniform(3 / 4, 4 / 3)
                w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
                if 0 < w <= WIDTH and 0 < h <= HEIGHT:
                    break
            rows.append((h * w / (HEIGHT * WIDTH), math.log(w / h)))
        scale, log_aspect = np.array(rows).T
    elif wrong == "scale (0.2, 1)":
        scale, log_aspect = _reference(KEYS, scale=(0.2, 1.0), seed=1)
    else:
        scale, log_aspect = _reference(KEYS, ratio=(0.5, 2.0), seed=1)
    limit = ks_limit(KEYS, REFERENCE)
    assert max(ks_statistic(scale, ref_scale), ks_statistic(log_aspect, ref_log_aspect)) > limit
    # ...while a second sample of the right distribution passes.
    same_scale, same_log_aspect = _reference(KEYS, seed=2)
    assert max(ks_statistic(same_scale, ref_scale), ks_statistic(same_log_aspect, ref_log_aspect)) < limit


def test_ks_statistic_matches_its_definition():
    a, b = np.array([0.1, 0.2, 0.3]), np.array([0.25, 0.35, 0.45, 0.55])
    # CDFs at 0.3: 3/3 against 1/4 -> the largest gap 0.75.
    assert ks_statistic(a, b) == pytest.approx(0.75)
    assert ks_statistic(a, a) == 0.0
