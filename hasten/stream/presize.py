"""Pre-sized JPEGs: bound each stored image's longer side, as FFCV's ``max_resolution`` does.

A random-resized crop to 224 px rarely needs more than a few hundred pixels of its
source, yet every epoch decodes (part of) the stored image again. Storing each
JPEG with its longer side at most ``max_side`` (aspect ratio kept, the shorter
side rounded to the nearest pixel) makes every later decode cheaper and the
shards smaller, at the price of re-encoding once. ``hasten data pack --max-side N``
(``hasten.stream.pack``) applies it to every image it packs; ``presize`` is
usable alone on the bytes of one file.

What is done, and why:

- An image whose longer side is already within ``max_side`` is returned as the
  very same bytes (nothing decoded, nothing re-encoded: no generation loss).
- A larger JPEG is decoded by hasten's own decoder (``hasten.decode.image``: the
  pixels every hasten reader would have seen), resized with Pillow's ``LANCZOS``
  filter, and encoded at ``quality`` (default 90, FFCV's default ``jpeg_quality``)
  with the source's chroma subsampling (4:4:4, 4:2:2 or 4:2:0; 4:2:0 for any
  other) by simplejpeg when it imports, else by Pillow. Lanczos rather than the
  bilinear filter of the training crop: the reduction is done once, offline, so
  its cost does not matter, and Pillow's Lanczos (support scaled with the
  reduction, so antialiased) keeps more detail than bilinear or box filtering
  for the same removal of aliasing; the crop then resamples these pixels again.
  torch's antialiased kernels offer bilinear and bicubic only. EXIF and other
  metadata are not carried over; hasten's decoders ignore them anyway.
- Anything else is returned unchanged with the reason: a PNG larger than the
  bound (only JPEGs are re-encoded, a PNG stays lossless) and a file that cannot
  be read (the reader skips and counts it by name, as it does without
  ``max_side``). ``pack`` counts these and records them in its index.

Based on: FFCV's ``RGBImageField(max_resolution=..., jpeg_quality=90)``
(Leclerc et al., "FFCV: Accelerating Training by Removing Data Bottlenecks",
CVPR 2023).

Changes the training math: yes. The stored images have fewer pixels (and one
more round of JPEG loss), so every crop is taken from a smaller picture: crops
upsample more and hold less detail. docs/streaming.md quotes what FFCV reports.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from hasten.data.bad_files import bad_reason
from hasten.decode import backends
from hasten.decode.header import Header, read_header
from hasten.decode.image import decode
from hasten.errors import BadImageError

MIN_SIDE = 32          # below it an image is a thumbnail, not training data: a typo, refused
DEFAULT_QUALITY = 90   # FFCV's default jpeg_quality
_SUBSAMPLING = ("444", "422", "420")
_PILLOW_SUBSAMPLING = {"444": 0, "422": 1, "420": 2}  # Pillow's codes for the same


@dataclass(frozen=True)
class Presized:
    """One image after ``presize``: its bytes, whether they were re-encoded, and,
    when an image larger than the bound was kept as it is, why (else "")."""

    data: bytes
    resized: bool
    kept_because: str = ""


def encoder() -> str:
    """The JPEG encoder ``presize`` uses here: "simplejpeg" or "pillow"."""
    return "pillow" if backends.simplejpeg is None else "simplejpeg"


def bounded_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(height, width) scaled so that the longer side is ``max_side`` (unchanged
    when it already is at most that), the shorter side rounded, at least 1."""
    longer = max(height, width)
    if longer <= max_side:
        return height, width
    scale = max_side / longer
    if height >= width:
        return max_side, max(1, round(width * scale))
    return max(1, round(height * scale)), max_side


def check_max_side(max_side: int) -> None:
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < MIN_SIDE:
        raise ValueError(f"max_side must be an integer >= {MIN_SIDE}; got {max_side!r}")


def check_quality(quality: int) -> None:
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be an integer in 1..100; got {quality!r}")


def presize(data: bytes, name: str, max_side: int, quality: int = DEFAULT_QUALITY) -> Presized:
    """``data`` with its longer side bounded by ``max_side`` (see the module doc)."""
    check_max_side(max_side)
    check_quality(quality)
    try:
        header = read_header(data, name)
    except BadImageError as e:
        return Presized(data, False, bad_reason(e, name))
    height, width = header.height, header.width
    if max(height, width) <= max_side:
        return Presized(data, False)
    if header.format != "jpeg":
        return Presized(data, False, f"{header.format} of {width}x{height}: only JPEGs are re-encoded")
    try:
        array = decode(data, name, header=header)  # (a decode that disagrees with the header is refused)
        small = _resize(array, bounded_size(height, width, max_side), name)
        return Presized(_encode(small, quality, _subsampling(header), name), True)
    except BadImageError as e:
        return Presized(data, False, bad_reason(e, name))


def _resize(array: np.ndarray, size_hw: tuple[int, int], name: str) -> np.ndarray:
    from PIL import Image

    try:
        return np.asarray(Image.fromarray(array).resize(size_hw[::-1], Image.LANCZOS), dtype=np.uint8)
    except Exception as e:  # noqa: BLE001 - any failure is this file's, reported by name
        raise BadImageError(f"{name}: cannot resize: {type(e).__name__}: {e}") from None


def _subsampling(header: Header) -> str:
    """The source's chroma subsampling when it is one of 4:4:4, 4:2:2, 4:2:0; else 4:2:0."""
    return header.subsampling if header.subsampling in _SUBSAMPLING else "420"


def _encode(array: np.ndarray, quality: int, subsampling: str, name: str) -> bytes:
    try:
        if backends.simplejpeg is not None:
            return backends.simplejpeg.encode_jpeg(np.ascontiguousarray(array), quality=quality, colorspace="RGB",
                                                 colorsubsampling=subsampling)
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(array).save(buf, "JPEG", quality=quality, subsampling=_PILLOW_SUBSAMPLING[subsampling])
        return buf.getvalue()
    except Exception as e:  # noqa: BLE001
        raise BadImageError(f"{name}: cannot encode: {type(e).__name__}: {e}") from None
