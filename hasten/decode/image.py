"""``decode``: an image's bytes to RGB pixels, whole, at a DCT scale, or one region of it.

One entry for every reader of images in hasten. The header is read once
(``hasten.decode.header.read_header``, or the caller's ``Header``); it says the format,
and the format and the request pick the decoder:

- a region of a JPEG: libjpeg-turbo 3's partial decode (``hasten.decode.turbojpeg``:
  only the region's rows and columns, at the scale), where its library loads;
- a whole JPEG, or a region where that decoder cannot (no library, a CMYK JPEG):
  simplejpeg at the scale, then cut; where simplejpeg is missing or fails, Pillow
  (``Image.draft`` for the scale), which also names the reason of a bad file;
- a PNG: Pillow, at full size.

A header that claims more pixels than Pillow's decompression-bomb limit goes to Pillow,
which refuses it by name. ``decode_image`` and ``decode_fitted`` add the usual evaluation
resize (shorter side to S, centre SxS crop) for the decoded-once sets and whole-image crops.

Bad input: every failure is a ``BadImageError`` naming the file, never a traceback from
inside a decoder; truncated files are refused, not padded with grey.

Changes the training math: no (a decoder; the scale and the region are the caller's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hasten.decode import backends, turbojpeg
from hasten.decode.header import Header, image_format, read_header
from hasten.errors import BadImageError

FULL = (1, 1)


@dataclass(frozen=True)
class Region:
    """A box in pixels of the image decoded at the requested scale."""

    top: int
    left: int
    height: int
    width: int


Window = Callable[[Header], tuple[tuple[int, int], Region]]


def decode(data: bytes, name: str = "<bytes>", *, header: Header | None = None, scale: tuple[int, int] = FULL,
           region: Region | Window | None = None) -> np.ndarray:
    """``data`` as (H, W, 3) uint8 RGB; ``BadImageError`` naming ``name`` if it is not a
    readable JPEG or PNG.

    ``scale`` = (num, denom), a JPEG's DCT scale, one of libjpeg's n/8: the image at
    that scale (a whole JPEG that Pillow decodes: at the nearest of 1/2, 1/4, 1/8 at or
    above it). ``region``: only that box of the image at ``scale``, exactly; or a
    function of the ``Header`` that returns (scale, region), for a caller that picks them
    from the image's size (a random crop box: ``hasten.stream.fused_crop``)."""
    header = header or read_header(data, name)
    if callable(region):
        scale, region = region(header)
    g = math.gcd(*scale)
    scale = scale[0] // g, scale[1] // g  # (2, 4) is 1/2
    if scale != FULL and not header.scalable:
        raise ValueError(f"{name}: a {header.format.upper()} decodes at full size only, not at {scale[0]}/{scale[1]}")
    size = header.scaled(scale)
    array = None
    if header.format == "jpeg" and header.pixels <= backends.max_pixels():  # larger: Pillow refuses it by name
        if region is not None and turbojpeg.available():
            try:
                box = (region.top, region.left, region.height, region.width)
                rows, (_, left) = turbojpeg.decode_region(data, box, scale, name)
                return rows[:, region.left - left:]  # the decoded rows start on an iMCU column at or left of the box
            except BadImageError:
                pass  # decoded whole below, which names the reason (or converts a CMYK JPEG)
        if backends.simplejpeg is not None:
            try:
                array = backends.decode_simplejpeg(data, None if scale == FULL else size)
            except Exception:  # noqa: BLE001 - Pillow retries and names the reason
                array = None
    if array is None:
        draft = None if scale == FULL else (max(1, header.width * scale[0] // scale[1]),
                                            max(1, header.height * scale[0] // scale[1]))
        array = backends.decode_pillow(data, name, draft)
    if (region is not None or scale == FULL) and array.shape[:2] != size:
        raise BadImageError(f"{name}: header says {size[1]}x{size[0]}, decoded {array.shape[1]}x{array.shape[0]}")
    if region is None:
        return array
    return array[region.top:region.top + region.height, region.left:region.left + region.width]


def fit_scale(header: Header, size: int) -> tuple[int, int]:
    """The smallest n/8 DCT scale at which the image still covers ``size`` x ``size``
    (full size for a PNG, or an image smaller than that)."""
    if header.scalable:
        # libjpeg's output at n/8 is ceil(side * n / 8), which is >= size exactly when
        # n > 8 (size - 1) / side: the smallest such n for the shorter side, in closed form
        # (a loop over n cost more than the decode of a 32-pixel image).
        n = 8 * (size - 1) // min(header.height, header.width) + 1
        if n < 8:
            g = math.gcd(n, 8)
            return n // g, 8 // g
    return FULL


def decode_image(data: bytes, name: str = "<bytes>", image_size: int | None = None) -> np.ndarray:
    """The whole image at full size; with ``image_size=S``, its shorter side resized to S
    (Pillow bicubic with antialiasing) and the centre SxS cut (an SxS image untouched)."""
    array = decode(data, name)
    if image_size is not None and array.shape[:2] != (image_size, image_size):
        array = resize_center_crop(array, image_size, name)
    return array


def decode_fitted(data: bytes, name: str, image_size: int | None) -> np.ndarray:
    """``decode_image``, but a JPEG larger than ``image_size`` is decoded at the smallest
    DCT scale that still covers it (``fit_scale``): fewer pixels to decode and to resize
    (decode and downscale fused, as TF's ``decode_and_crop_jpeg`` does for ImageNet). The
    streaming pipeline's whole-image decoder, since it decodes every epoch. Pixels differ
    from ``decode_image``'s within resampling tolerance."""
    if image_size is None:
        return decode_image(data, name)
    if backends.simplejpeg is not None and image_format(data) == "jpeg":
        # simplejpeg picks the smallest n/8 scale that covers image_size itself: one call
        # with its own header read, without this module's Python around it (for a 32-pixel
        # CIFAR image that Python cost more than the decode: 21 us against 8 us).
        try:
            h, w = backends.simplejpeg_header(data)[:2]
            if h * w <= backends.max_pixels():
                array = backends.decode_simplejpeg(data, (min(h, image_size), min(w, image_size)))
                return array if array.shape[:2] == (image_size, image_size) else \
                    resize_center_crop(array, image_size, name)
        except Exception:  # noqa: BLE001 - the general path below decodes it again and names the reason
            pass
    header = read_header(data, name)
    array = decode(data, name, header=header, scale=fit_scale(header, image_size))
    if array.shape[:2] == (image_size, image_size):
        return array
    return resize_center_crop(array, image_size, name)


def resize_center_crop(array: np.ndarray, size: int, name: str = "<bytes>") -> np.ndarray:
    """Resize the shorter side of an (H, W, 3) uint8 image to ``size``, then crop
    the centre ``size`` x ``size`` (the usual evaluation transform)."""
    from PIL import Image

    h, w = array.shape[:2]
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    try:
        img = Image.fromarray(array).resize((new_w, new_h), Image.BICUBIC)
    except Exception as e:  # noqa: BLE001
        raise BadImageError(f"{name}: cannot resize: {type(e).__name__}: {e}") from None
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return np.asarray(img, dtype=np.uint8)[top : top + size, left : left + size]
