"""Fused JPEG decode + random-resized crop: decode only as many pixels as the crop needs.

ImageNet training crops a random box (8% to 100% of the area, aspect ratio 3/4 to
4/3) out of a ~500x375 image and resizes it to 224x224. Decoding the whole image
at full resolution first wastes most of the work: a box of 200x150 pixels that
ends up as 224x224 needs every pixel, but a box of 400x350 only needs half of
them in each direction. JPEG can decode at 1/2, 1/4 or 1/8 of the size in the DCT
domain (libjpeg's scaled IDCT) for a fraction of the cost. So the box is drawn
first, from the image header's size (read once, ``hasten.decode.header``); then
``dct_scale`` picks the smallest of 1/8, 1/4, 1/2, 1 at which the box still has at
least the output's pixels in both directions (a PNG: 1); the box, rounded to whole
pixels of the image at that scale, is the region that ``hasten.decode.image.decode``
decodes (libjpeg-turbo 3's partial decode where it loads: only the box's rows and
columns; see there for the others). This module holds the geometry: the region is
resized to the output (plain
bilinear with OpenCV, or ``antialias=True`` for Pillow's antialiased filter) and
flipped with torch's kernel, straight into its slot of the batch. Measured per
stage in ``benchmarks/imagenet_pipeline.py``. Evaluation (``center_box``: the
centre square of 87.5% of the shorter side, i.e. resize to 256 then centre-crop
224) uses the same path.

``random_resized_box`` draws boxes from the same distribution as torchvision's
``RandomResizedCrop`` (scale (0.08, 1), log-uniform ratio (3/4, 4/3), ten tries,
then a centre crop clamped to the ratio range), written out here: hasten does
not depend on torchvision.

Based on: Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods" (2019)
and TensorFlow's ``decode_and_crop_jpeg`` (fused decode and crop for ImageNet);
Szegedy et al., "Going deeper with convolutions" (2015) for the crop distribution.

Changes the training math: the crop distribution is the usual one (boxes as
torchvision draws them; a box's edges move by at most half a pixel of the scaled
decode). Pixels differ from decode-then-crop-then-resize by the DCT-domain
downscale (block averages instead of a spatial filter) and, by default, by the
resize filter: plain bilinear, as TensorFlow's reference ResNet-50 pipeline,
instead of torchvision's antialiased one (``antialias=True`` restores it at about
3x the resize's cost). Measured in tests/test_stream_fused_crop.py.
"""

from __future__ import annotations

import multiprocessing as mp
import math
from dataclasses import dataclass

import numpy as np
import torch

from hasten.decode.header import Header
from hasten.decode.image import Region, decode
from hasten.errors import BadImageError

SCALES = (8, 4, 2, 1)  # DCT downscale factors tried, smallest output first: 1/8, 1/4, 1/2, 1
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3 / 4, 4 / 3)
EVAL_CROP_FRACTION = 0.875  # resize to 256, crop the centre 224


@dataclass(frozen=True)
class Box:
    """A crop box in pixels of the full-size image."""

    top: int
    left: int
    height: int
    width: int


def random_resized_box(height: int, width: int, rng: np.random.Generator,
                       scale: tuple[float, float] = RRC_SCALE, ratio: tuple[float, float] = RRC_RATIO) -> Box:
    """A box drawn as torchvision's ``RandomResizedCrop.get_params`` draws it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return Box(top, left, h, w)
    # Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


def center_box(height: int, width: int, fraction: float = EVAL_CROP_FRACTION) -> Box:
    """The centre square of side ``fraction`` x the shorter side (resize-then-centre-crop as one box)."""
    side = max(1, int(round(min(height, width) * fraction)))
    return Box((height - side) // 2, (width - side) // 2, side, side)


def dct_scale(box: Box, size: int) -> int:
    """The largest factor f in 8, 4, 2, 1 such that the box decoded at 1/f still
    has at least ``size`` pixels in each direction (1 when it has fewer at full size)."""
    for f in SCALES:
        if box.height // f >= size and box.width // f >= size:
            return f
    return 1


def fused_crop(data: bytes, name: str, size: int, *, rng: np.random.Generator | None = None,
               flip: bool | None = None, fused: bool = True, out: np.ndarray | None = None,
               antialias: bool = False) -> np.ndarray:
    """Decode ``data`` into one ``size`` x ``size`` (H, W, 3) uint8 crop.

    With ``rng``: a random-resized crop and (unless ``flip`` says) a flip with
    probability 1/2 (training); without: the centre crop (evaluation). ``fused=False``
    decodes the box at full size (the reference the fused path is tested against).
    ``out``: a (size, size, 3) uint8 array to write the crop into (a batch's slot),
    returned; else a new array. ``antialias``: resize with Pillow's antialiased bilinear
    filter (torchvision's default) instead of plain bilinear (see ``resize_whole``).
    """

    def window(header: Header) -> tuple[tuple[int, int], Region]:
        """The box, drawn from the header's size, as the region to decode and its scale."""
        box = random_resized_box(header.height, header.width, rng) if rng is not None else \
            center_box(header.height, header.width)
        factor = dct_scale(box, size) if fused and header.scalable else 1
        return (1, factor), _scaled_box(box, factor, header.scaled((1, factor)))

    crop = decode(data, name, region=window)
    if flip is None:
        flip = bool(rng.random() < 0.5) if rng is not None else False
    return _finish(resize_whole(crop, size, name, antialias=antialias, out=out), flip, out)


def _scaled_box(box: Box, factor: int, scaled_hw: tuple[int, int]) -> Region:
    """``box`` in whole pixels of the image decoded at 1/``factor`` (``scaled_hw``):
    rounded, at most ``factor`` / 2 full-size pixels per edge, well under the crop's
    own randomness."""
    sh, sw = scaled_hw
    top, left = min(round(box.top / factor), sh - 1), min(round(box.left / factor), sw - 1)
    bottom = min(max(top + 1, round((box.top + box.height) / factor)), sh)
    right = min(max(left + 1, round((box.left + box.width) / factor)), sw)
    return Region(top, left, bottom - top, right - left)


def _finish(image: np.ndarray, flip: bool, out: np.ndarray | None) -> np.ndarray:
    """Flip (torch's kernel: numpy copies a reversed 3-byte-pixel view byte by byte, about
    15x slower) and place the crop in ``out`` if given."""
    if out is not None and image is out:  # OpenCV resized it straight into its slot: flip it there
        if flip:
            _opencv().flip(out, 1, dst=out)
        return out
    t = torch.from_numpy(np.ascontiguousarray(image) if image.flags.writeable else image.copy())
    if flip:
        t = t.flip(1)
    if out is None:
        return t.numpy()
    torch.from_numpy(out).copy_(t)
    return out


_cv2 = None  # OpenCV, imported on first use (None: not looked for; False: not installed)


def _opencv():
    global _cv2
    if _cv2 is None:
        try:
            import cv2

            if mp.parent_process() is not None:
                cv2.setNumThreads(1)  # a decode worker is one of several processes: no thread pool
            _cv2 = cv2
        except ImportError:
            _cv2 = False
    return _cv2 or None


def resize_whole(crop: np.ndarray, size: int, name: str = "<bytes>", *, antialias: bool = False,
                 out: np.ndarray | None = None) -> np.ndarray:
    """All of ``crop`` (H, W, 3) uint8 to a ``size`` x ``size`` (H, W, 3) uint8 array.

    ``out``: a (size, size, 3) uint8 slot that OpenCV may resize into directly (then
    ``out`` itself is returned: no copy into the batch afterwards); otherwise ignored.

    Default: plain bilinear (half-pixel centres), as TensorFlow's ResNet-50 input
    pipeline resizes its decoded crop; the DCT-scaled decode has already done any
    reduction by 2, 4 or 8, so what is left is under 2x, where bilinear without a
    wider filter aliases little. OpenCV's ``cv2.resize`` (a dependency; when it
    cannot be imported: torch's uint8 kernel: the same filter; with its copy
    to HWC, several times slower). ``antialias=True``: Pillow's antialiased bilinear
    (torchvision's ``RandomResizedCrop`` default), torch's kernel when torch runs one
    thread, else Pillow: about 3x the cost of plain bilinear here."""
    try:
        if not antialias and (cv2 := _opencv()) is not None:
            # OpenCV reads rows at any stride: the box cut out of the decoded region is not copied.
            if out is not None and out.shape == (size, size, 3) and out.dtype == np.uint8 and out.flags.c_contiguous:
                got = cv2.resize(crop, (size, size), dst=out, interpolation=cv2.INTER_LINEAR)
                if np.shares_memory(got, out):  # (OpenCV allocates anew, silently, when dst does not fit)
                    return out
                return got
            return cv2.resize(crop, (size, size), interpolation=cv2.INTER_LINEAR)
        crop = np.ascontiguousarray(crop)
        if torch.get_num_threads() == 1 or not antialias:
            t = torch.from_numpy(crop if crop.flags.writeable else crop.copy()).permute(2, 0, 1).unsqueeze(0)
            out = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear", antialias=antialias,
                                                  align_corners=False)
            # torch returns (1, 3, S, S) contiguous: its copy to HWC is about 2x faster than numpy's.
            return out[0].permute(1, 2, 0).contiguous().numpy()
        from PIL import Image

        return np.asarray(Image.fromarray(crop).resize((size, size), Image.BILINEAR), dtype=np.uint8)
    except Exception as e:  # noqa: BLE001
        raise BadImageError(f"{name}: cannot resize: {type(e).__name__}: {e}") from None


def _philox_key(seed: int, epoch: int, key: int) -> np.ndarray:
    return np.array([int(key) & 0xFFFFFFFFFFFFFFFF, ((int(seed) & 0xFFFFFFFF) << 32) | (int(epoch) & 0xFFFFFFFF)],
                    dtype=np.uint64)


def example_rng(seed: int, epoch: int, key: int) -> np.random.Generator:
    """The generator of one example's augmentation: a function of (seed, epoch, key)
    only, so a crop does not depend on which worker decodes it or on resuming.

    Philox keyed by the triple: a counter-based generator, in which every key is its own
    stream with no seeding step (as JAX's and DALI's per-sample generators); numpy's
    ``default_rng([seed, epoch, key])`` hashes its seed first, about 40 us per example.
    ``ExampleRngs`` gives the same streams, re-keying one generator."""
    return np.random.Generator(np.random.Philox(key=_philox_key(seed, epoch, key)))


class ExampleRngs:
    """``example_rng`` for one example after another in one thread: one Philox generator
    re-keyed per example (a few microseconds instead of about 30 for a new one). The
    generator returned is the same object each call: use it before asking for the next."""

    def __init__(self) -> None:
        self._bits = np.random.Philox(key=0)
        self._gen = np.random.Generator(self._bits)
        self._fresh = self._bits.state  # a new Philox's state: counter and buffer at zero

    def __call__(self, seed: int, epoch: int, key: int) -> np.random.Generator:
        state = self._fresh
        state["state"]["key"] = _philox_key(seed, epoch, key)
        state["state"]["counter"] = np.zeros(4, dtype=np.uint64)
        state["buffer"] = np.zeros(4, dtype=np.uint64)
        state.update(buffer_pos=4, has_uint32=0, uinteger=0)
        self._bits.state = state
        return self._gen
